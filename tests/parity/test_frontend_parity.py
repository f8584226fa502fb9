"""Frontend features and resampling against the official tools' outputs (vectors/frontend)."""

from __future__ import annotations

import pytest
import torch

from cosyclone.frontend import audio, features
from tests.parity.conftest import load_vector_set

_SRC = {"48000": "wav_48k", "44100": "wav_44k1", "24000": "wav_24k", "16000": "wav_16k"}


@pytest.fixture(scope="module")
def vec() -> dict[str, torch.Tensor]:
    return load_vector_set("frontend")[1]


def test_whisper_log_mel(vec: dict[str, torch.Tensor]) -> None:
    got, _ = features.whisper_log_mel(vec["inputs.wav_16k"])
    assert got.shape == vec["whisper_log_mel_128"].shape
    assert (got - vec["whisper_log_mel_128"]).abs().max() < 1e-5


def test_kaldi_fbank(vec: dict[str, torch.Tensor]) -> None:
    fb, n = features.kaldi_fbank(vec["inputs.wav_16k"])
    assert (fb[0] - vec["kaldi_fbank_80"]).abs().max() < 2e-3
    norm = features.mean_normalize(fb, n)[0]
    assert (norm - vec["kaldi_fbank_80_mean_normalized"]).abs().max() < 2e-3


def test_flow_mel(vec: dict[str, torch.Tensor]) -> None:
    mel, _ = features.flow_mel(vec["inputs.wav_24k"])
    assert (mel - vec["flow_prompt_mel_80"]).abs().max() < 1e-5
    assert torch.allclose(mel.transpose(1, 2), vec["flow_prompt_mel_80_frontend_layout"], atol=1e-5)


@pytest.mark.parametrize("name", ["48000_to_16000", "48000_to_24000", "24000_to_16000",
                                  "44100_to_24000", "44100_to_16000"])
def test_resample(vec: dict[str, torch.Tensor], name: str) -> None:
    a, b = name.split("_to_")
    got = audio.resample(vec[f"inputs.{_SRC[a]}"], int(a), int(b))
    ref = vec[f"resample.{name}"]
    assert got.shape == ref.shape
    assert (got - ref).abs().max() < 1e-5


def test_batched_rows_match_single(vec: dict[str, torch.Tensor]) -> None:
    w16 = vec["inputs.wav_16k"][0]
    short = w16[:15000]
    batch = torch.zeros(2, w16.numel())
    batch[0], batch[1, :15000] = w16, short
    lens = torch.tensor([w16.numel(), 15000])
    wm, wn = features.whisper_log_mel(batch, lens)
    one, _ = features.whisper_log_mel(short)
    assert int(wn[1]) == one.shape[-1]
    assert torch.allclose(wm[1, :, :int(wn[1])], one[0], atol=1e-6)
    assert torch.allclose(wm[0], vec["whisper_log_mel_128"][0], atol=1e-5)
    fb, fn = features.kaldi_fbank(batch, lens)
    fb1, _ = features.kaldi_fbank(short)
    assert torch.allclose(features.mean_normalize(fb, fn)[1, :int(fn[1])],
                          features.mean_normalize(fb1, torch.tensor([fb1.shape[1]]))[0], atol=1e-5)
    fm, mn = features.flow_mel(batch, lens)
    fm1, _ = features.flow_mel(short)
    assert torch.allclose(fm[1, :, :int(mn[1])], fm1[0], atol=1e-5)
