"""`say -o NAME` writes what the name says: a .flac name FLAC; a name beside another --audio-format is
refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyclone.errors import CosycloneError
from cosyclone.folder.audio_out import AudioOutput
from cosyclone.options import FolderOptions


def test_the_file_name_picks_flac_over_the_default_container() -> None:
    out = AudioOutput.for_file(Path("x.FLAC"), FolderOptions(audio_encoding="pcm24"))
    assert (out.format, out.encoding) == ("flac", "pcm24")
    assert AudioOutput.for_file(Path("x.wav"), FolderOptions()).format == "wav"
    assert AudioOutput.for_file(Path("x.audio"), FolderOptions(audio_format="flac")).format == "flac"


def test_a_name_that_says_another_container_is_refused() -> None:
    with pytest.raises(CosycloneError, match=r"-o x\.wav names a WAV file, but --audio-format flac"):
        AudioOutput.for_file(Path("x.wav"), FolderOptions(audio_format="flac"))
    with pytest.raises(CosycloneError, match=r"-o x\.flac names a FLAC file, which stores integer samples"):
        AudioOutput.for_file(Path("x.flac"), FolderOptions(audio_encoding="float"))
