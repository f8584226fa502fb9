"""Audio loading/resampling and feature shapes, without reference vectors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import soundfile as sf
import torch

from cosyclone.errors import CosycloneError
from cosyclone.frontend import audio, features


def _tone(sr: int, seconds: float, freq: float = 440.0) -> torch.Tensor:
    t = torch.arange(int(sr * seconds), dtype=torch.float64) / sr
    return (0.3 * torch.sin(2 * math.pi * freq * t)).to(torch.float32)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG"])
def test_load_formats_and_stereo(tmp_path: Path, fmt: str) -> None:
    left, right = _tone(22050, 0.5), _tone(22050, 0.5, 660.0)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(str(path), torch.stack([left, right], 1).numpy(), 22050, format=fmt)
    wave, sr = audio.load_audio(path)
    assert sr == 22050 and wave.dtype == torch.float32 and wave.dim() == 1
    if fmt != "OGG":
        assert torch.allclose(wave, (left + right) / 2, atol=1e-3)


def test_rejects_low_rate_and_long(tmp_path: Path) -> None:
    sf.write(str(tmp_path / "lo.wav"), _tone(8000, 0.2).numpy(), 8000)
    with pytest.raises(CosycloneError, match="row 'r1'.*8000 Hz"):
        audio.load_audio(tmp_path / "lo.wav", row_id="r1")
    with pytest.raises(CosycloneError, match="at most 30"):
        audio.check_prompt(torch.zeros(16000 * 31), 16000, row_id="r2")
    with pytest.raises(CosycloneError, match="cannot read"):
        audio.load_audio(tmp_path / "missing.wav")


def test_resample_lengths_and_tone() -> None:
    x = _tone(48000, 0.25, 1000.0)
    y = audio.resample(x, 48000, 16000)
    assert y.shape == (4000,)
    ref = _tone(16000, 0.25, 1000.0)
    assert (y[200:-200] - ref[200:-200]).abs().max() < 1e-2
    z = audio.resample(x[None].repeat(2, 1), 44100, 24000)
    assert z.shape == (2, math.ceil(x.numel() * 24000 / 44100))
    assert audio.resample(x, 16000, 16000) is x


def test_feature_shapes() -> None:
    w = _tone(16000, 1.0)
    m, n = features.whisper_log_mel(w)
    assert m.shape == (1, 128, 100) and int(n[0]) == 100
    fb, fn = features.kaldi_fbank(w)
    assert fb.shape == (1, 98, 80) and int(fn[0]) == 98
    mel, mn = features.flow_mel(_tone(24000, 1.0))
    assert mel.shape == (1, 80, 50) and int(mn[0]) == 50


def test_filterbank_properties() -> None:
    fb = features.slaney_mel_filterbank(16000, 400, 128)
    assert fb.shape == (128, 201) and (fb >= 0).all() and (fb.sum(1) > 0).all()
    kb = features.kaldi_mel_banks(80, 512, 16000.0)
    assert kb.shape == (80, 257) and kb[:, -1].abs().sum() == 0


def test_align_prompt() -> None:
    feat, tok = features.align_prompt(torch.zeros(75, 80), torch.arange(40))
    assert feat.shape == (74, 80) and tok.shape == (37,)
    feat, tok = features.align_prompt(torch.zeros(75, 80), torch.arange(30))
    assert feat.shape == (60, 80) and tok.shape == (30,)
