"""validate refuses the prompts synth would fail on, at their line, and says what is wrong with each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cosyclone.frontend.audio import AudioError, check_prompt
from cosyclone.manifest import read_manifest


def _manifest(tmp_path: Path, prompts: list[str]) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": "Hello there.", "prompt_text": "Hi.",
                                        "prompt_audio": p}) + "\n" for i, p in enumerate(prompts)))
    return path


def test_prompts_synth_would_fail_on_are_refused_at_their_line(tmp_path: Path) -> None:
    sf.write(str(tmp_path / "short.wav"), np.zeros(10, np.float32) + 0.1, 16000)
    nan = np.full(16000, 0.1, np.float32)
    nan[100] = np.nan
    sf.write(str(tmp_path / "nan.wav"), nan, 16000, subtype="FLOAT")
    sf.write(str(tmp_path / "good.wav"), np.full(16000, 0.1, np.float32), 16000)
    os.mkfifo(tmp_path / "fifo.wav")
    os.symlink(tmp_path / "gone.wav", tmp_path / "broken.wav")
    read = read_manifest(_manifest(tmp_path, ["short.wav", "nan.wav", "fifo.wav", "https://x.org/a.wav",
                                              "broken.wav", "good.wav"]))
    assert [r.id for r in read.rows] == ["r5"]
    why = {e.line: str(e) for e in read.errors}
    assert "10 samples" in why[1] and "at least 0.1 s" in why[1]
    assert "1 NaN/inf samples" in why[2]
    assert "not a regular file (a FIFO" in why[3]
    assert "is a URL" in why[4] and "file not found" not in why[4]
    assert "a broken symlink" in why[5]


def test_synth_refuses_a_prompt_too_short_for_the_frontend() -> None:
    with pytest.raises(AudioError, match="10 samples .*at least 0.1 s"):
        check_prompt(torch.full((10,), 0.1), 16000, row_id="r")
    check_prompt(torch.full((1600,), 0.1), 16000, row_id="r")
