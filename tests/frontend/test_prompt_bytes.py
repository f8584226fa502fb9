"""A prompt's bytes read by another process (the Ray driver ships them) give the frontend exactly what
the file gives: the same samples, the same features bit for bit, the same cache key, and a bad file
fails with the same message, naming the path as the manifest resolved it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from cosyclone.frontend import Frontend
from cosyclone.frontend.audio import AudioError, PromptBytes, load_audio
from cosyclone.frontend.prompt_cache import audio_digest
from cosyclone.model.config import load_model_config

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = sorted((ROOT / "manifests" / "prompts").glob("*.wav"))


@pytest.mark.parametrize("path", PROMPTS, ids=[p.name for p in PROMPTS])
def test_bytes_decode_to_the_files_samples_and_hash_to_its_key(path: Path) -> None:
    shipped = PromptBytes(str(path), path.read_bytes())
    wave, sr = load_audio(path)
    again, sr2 = load_audio(shipped)
    assert sr == sr2 and torch.equal(wave, again)
    assert audio_digest(shipped) == audio_digest(path)


def test_the_frontend_reads_a_shipped_path_from_its_bytes_with_identical_features(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    source = tmp_path / "speaker.wav"
    shutil.copy(PROMPTS[0], source)
    from_file = Frontend(load_model_config(tiny_model_dir), prompt_cache_entries=0).prompt_features(source)
    fe = Frontend(load_model_config(tiny_model_dir), prompt_cache_entries=0)
    fe.prompt_bytes = {str(source): source.read_bytes()}
    source.unlink()  # the file is gone here, as on a node without the prompts
    shipped = fe.prompt_features(source)
    assert from_file.keys() == shipped.keys()
    for key in from_file:
        assert torch.equal(from_file[key], shipped[key]), key


def test_an_unreadable_prompt_fails_with_the_files_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    with pytest.raises(AudioError) as on_disk:
        load_audio(bad, row_id="r")
    with pytest.raises(AudioError) as shipped:
        load_audio(PromptBytes(str(bad), bad.read_bytes()), row_id="r")
    assert str(shipped.value).split(": ")[:2] == str(on_disk.value).split(": ")[:2]
    assert f"cannot read prompt audio {bad}" in str(shipped.value)
