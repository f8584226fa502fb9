"""Two promises of the commands: `say -o x.flac` writes FLAC bytes, and `synth --dry-run` writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import soundfile as sf
from typer.testing import CliRunner

from cosyclone.cli import app

ROOT = Path(__file__).resolve().parents[2]
PROMPT = ROOT / "manifests" / "prompts" / "speaker1.wav"


def test_say_to_a_flac_name_writes_flac(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "hello.flac"
    res = CliRunner().invoke(app, ["say", "Hello there.", "--prompt-audio", str(PROMPT), "--prompt-text",
                                   "This is the reference speaker talking.", "--model-dir",
                                   str(tiny_model_dir), "-o", str(out), "--max-tokens", "5"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:4] == b"fLaC" and sf.info(str(out)).format == "FLAC"
    assert "(flac, pcm16)" in res.output


def test_dry_run_creates_no_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    res = CliRunner().invoke(app, ["synth", str(ROOT / "manifests" / "example.jsonl"), "--model-dir",
                                   str(tiny_model_dir), "--out", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "4 to synthesize" in res.output and not (tmp_path / "not").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_dry_run_refuses_a_folder_it_could_not_make(tiny_model_dir: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        res = CliRunner().invoke(app, ["synth", str(ROOT / "manifests" / "example.jsonl"), "--model-dir",
                                       str(tiny_model_dir), "--out", str(locked / "out"), "--dry-run"])
    finally:
        locked.chmod(0o700)
    assert res.exit_code == 4 and "is not writable" in res.output


def test_a_folder_under_a_file_cannot_be_made(tmp_path: Path) -> None:
    from cosyclone.folder.layout import OutputFolderError, check_creatable

    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputFolderError, match=r"cannot be made: .*file is not a folder"):
        check_creatable(tmp_path / "file" / "out")
    check_creatable(tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
