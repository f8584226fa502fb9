"""Frontend features and resampling against the official tools' outputs (vectors/frontend).

cosyclone computes the features in float64 (one rounding to float32 at the end), so what differs
from the reference is the reference's own float32 rounding. Each feature is therefore checked per
element against a worst-case bound of that rounding (``tests/parity/rounding.py`` derives it),
computed from the input wave alone: loud bands must agree to ~1e-7, a band 90 dB down may differ
by what float32 can resolve there. Where the vectors' JSON measured the official function's
float64-vs-float32 gap (``tolerance_observed.fp64_vs_fp32_maxabs``), the largest error must also
stay within twice that gap. Negative controls show the bounds still catch real mistakes.
Input names, rates and resample pairs come from the vector set, never from this file.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cosyclone.frontend import audio, features
from tests.parity.rounding import (
    EPS32,
    dft_bin_error,
    magnitude_log_bound,
    output_rounding,
    power_log_bound,
)
from tests.reference import load_vector_set

F64 = torch.float64


@pytest.fixture(scope="module")
def frontend() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return load_vector_set("frontend")


def _rate(input_name: str) -> int:
    """``inputs.wav_16k`` → 16000, ``inputs.wav_44k1`` → 44100."""
    m = re.fullmatch(r"inputs\.wav_(\d+)k(\d?)", input_name)
    assert m, input_name
    return int(m.group(1)) * 1000 + int(m.group(2) or 0) * 100


def _wave(v: dict[str, torch.Tensor], rate: int) -> torch.Tensor:
    (name,) = [k for k in v if k.startswith("inputs.wav_") and _rate(k) == rate]
    return v[name]


# --- per-element bounds of the reference's float32 rounding (derivation in rounding.py) ---------


def whisper_bound(wave: torch.Tensor) -> torch.Tensor:
    """(1, 128, T): openai-whisper's centred 400/160 STFT, power, Slaney bank, log10/4, max-8 clamp."""
    n, hop = 400, 160
    w = wave.reshape(-1).to(F64)
    raw = F.pad(w[None, None], (n // 2, n // 2), mode="reflect")[0, 0].unfold(0, n, hop)[: w.numel() // hop]
    spec = torch.fft.rfft(raw * torch.hann_window(n, dtype=F64))
    banks = features.slaney_mel_filterbank(16000, n, 128).to(F64)
    bound = power_log_bound(spec, dft_bin_error(raw, n), banks, floor=1e-10) / (4.0 * math.log(10.0))
    loudest = (spec.abs().square() @ banks.T).argmax()
    return (bound + bound.flatten()[loudest]).T[None]  # max(x, max - 8): x's error plus the max's


def kaldi_bound(wave: torch.Tensor) -> torch.Tensor:
    """(T, 80): torchaudio kaldi fbank defaults; its float32 mel bank adds step 3's weight error."""
    n, hop, n_fft, lo = 400, 160, 512, 20.0
    w = wave.reshape(-1).to(F64)
    raw = w.unfold(0, n, hop)[: 1 + (w.numel() - n) // hop]
    x = raw - raw.mean(-1, keepdim=True)
    x = x - 0.97 * torch.cat([x[:, :1], x[:, :-1]], -1)
    x = F.pad(x * torch.hann_window(n, periodic=False, dtype=F64).pow(0.85), (0, n_fft - n))
    mel_hi, mel_lo = 1127.0 * math.log(1.0 + 8000.0 / 700.0), 1127.0 * math.log(1.0 + lo / 700.0)
    weight_err = 10.0 * EPS32 * mel_hi / ((mel_hi - mel_lo) / 81)
    return power_log_bound(
        torch.fft.rfft(x),
        dft_bin_error(raw, n_fft),
        features.kaldi_mel_banks(80, n_fft, 16000.0),
        floor=EPS32,
        bank_weight_error=weight_err,
    )


def flow_mel_bound(wave: torch.Tensor) -> torch.Tensor:
    """(1, 80, T): Matcha mel, reflect 720, uncentred 1920/480 STFT, sqrt(power + 1e-9), ln floor 1e-5."""
    n, hop = 1920, 480
    w = wave.reshape(-1).to(F64)
    raw = F.pad(w[None, None], ((n - hop) // 2, (n - hop) // 2), mode="reflect")[0, 0].unfold(0, n, hop)
    spec = torch.fft.rfft(raw * torch.hann_window(n, dtype=F64))
    banks = features.slaney_mel_filterbank(24000, n, 80).to(F64)
    return magnitude_log_bound(spec, dft_bin_error(raw, n), banks, floor=1e-5, offset=1e-9).T[None]


@pytest.fixture(scope="module")
def bounds(frontend) -> dict[str, torch.Tensor]:
    _, v = frontend
    fb = kaldi_bound(_wave(v, 16000))
    return {"whisper_log_mel_128": whisper_bound(_wave(v, 16000)), "kaldi_fbank_80": fb,
            # minus the per-bin mean: its error is at most the mean of the per-frame bounds
            "kaldi_fbank_80_mean_normalized": fb + fb.mean(0, keepdim=True),
            "flow_prompt_mel_80": flow_mel_bound(_wave(v, 24000))}


def check_within(name: str, got: torch.Tensor, meta: dict[str, Any], v: dict[str, torch.Tensor],
                 bound: torch.Tensor) -> float:
    """Assert |got - ref| <= bound + output rounding per element (and <= 2x the JSON's float64 gap
    where it was measured); returns the largest used fraction of the bound."""
    ref = v[name]
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    err = (got.to(F64) - ref.to(F64)).abs()
    limit = bound + output_rounding(ref)
    worst = int((err / limit).argmax())
    assert bool((err <= limit).all()), (
        f"{name}: element {worst} differs by {err.flatten()[worst]:.3g}, allowed {limit.flatten()[worst]:.3g}"
    )
    gap = meta["tolerance_observed"]["fp64_vs_fp32_maxabs"].get(name)
    if isinstance(gap, float):
        assert err.max().item() <= 2.0 * gap + float(output_rounding(ref).max()), (
            name,
            err.max().item(),
            gap,
        )
    return float((err / limit).max())


def test_whisper_log_mel(frontend, bounds) -> None:
    meta, v = frontend
    got, _ = features.whisper_log_mel(_wave(v, 16000))
    used = check_within("whisper_log_mel_128", got, meta, v, bounds["whisper_log_mel_128"])
    print(f"whisper log-mel: largest error uses {used:.1%} of its bound")


def test_kaldi_fbank(frontend, bounds) -> None:
    meta, v = frontend
    fb, n = features.kaldi_fbank(_wave(v, 16000))
    check_within("kaldi_fbank_80", fb[0], meta, v, bounds["kaldi_fbank_80"])
    norm = features.mean_normalize(fb, n)[0]
    check_within("kaldi_fbank_80_mean_normalized", norm, meta, v, bounds["kaldi_fbank_80_mean_normalized"])


def test_flow_mel(frontend, bounds) -> None:
    meta, v = frontend
    mel, _ = features.flow_mel(_wave(v, 24000))
    check_within("flow_prompt_mel_80", mel, meta, v, bounds["flow_prompt_mel_80"])
    # the frontend layout is the same tensor transposed
    assert torch.equal(v["flow_prompt_mel_80"].transpose(1, 2), v["flow_prompt_mel_80_frontend_layout"])


@pytest.mark.parametrize("mistake", ["gain +0.1%", "pre-emphasis 0.96", "fmax 8 kHz"])
def test_bounds_still_catch_mistakes(frontend, bounds, mistake: str) -> None:
    """Negative controls: plausible implementation slips exceed the per-element bounds."""
    meta, v = frontend
    w16, w24 = _wave(v, 16000), _wave(v, 24000)
    if mistake == "gain +0.1%":
        cases = [("whisper_log_mel_128", features.whisper_log_mel(w16 * 1.001)[0]),
                 ("kaldi_fbank_80", features.kaldi_fbank(w16 * 1.001)[0][0]),
                 ("flow_prompt_mel_80", features.flow_mel(w24 * 1.001)[0])]
    elif mistake == "pre-emphasis 0.96":
        cases = [("kaldi_fbank_80", features.kaldi_fbank(w16, preemph=0.96)[0][0])]
    else:  # CosyVoice2's mel fmax instead of CosyVoice3's Nyquist
        cases = [("flow_prompt_mel_80", features.flow_mel(w24, fmax=8000)[0])]
    for name, got in cases:
        with pytest.raises(AssertionError):
            check_within(name, got, meta, v, bounds[name])


def _resample_bound(x: torch.Tensor, orig_sr: int, new_sr: int) -> float:
    """Worst-case float32 rounding of a resampling by strided conv: both sides accumulate K taps,
    each within K*eps*sum|h|*max|x| (plus the float32 output), so 2 of those."""
    g = math.gcd(orig_sr, new_sr)
    kernel, _ = audio._sinc_kernel(orig_sr // g, new_sr // g, 6, 0.99)
    taps = kernel.shape[-1]
    l1 = float(kernel.abs().sum(-1).max())
    return 2.0 * (taps + 2) * EPS32 * l1 * float(x.abs().max())


def test_resample(frontend) -> None:
    meta, v = frontend
    pairs = [k for k in v if k.startswith("resample.")]
    assert pairs, "the vector set holds no resample outputs"
    gaps = meta["tolerance_observed"]["fp64_vs_fp32_maxabs"]
    for name in pairs:
        a, b = (int(r) for r in name.split(".", 1)[1].split("_to_"))
        src = _wave(v, a)
        got = audio.resample(src, a, b)
        ref = v[name]
        assert got.shape == ref.shape, name
        err = (got - ref).abs().max().item()
        assert err <= _resample_bound(src, a, b), (name, err)
        gap = gaps.get(name)
        if isinstance(gap, float):  # same kernel, so only the convolution's float32 rounding differs
            assert err <= 2.0 * gap + 2 * EPS32 * float(ref.abs().max()), (name, err, gap)


def test_batched_rows_match_single(frontend, bounds) -> None:
    """A row padded into a batch gives what it gives alone (and the full row its reference)."""
    meta, v = frontend
    w16 = _wave(v, 16000)[0]
    cut = (w16.numel() * 5) // 8
    short = w16[:cut]
    batch = torch.zeros(2, w16.numel())
    batch[0], batch[1, :cut] = w16, short
    lens = torch.tensor([w16.numel(), cut])
    wm, wn = features.whisper_log_mel(batch, lens)
    one, _ = features.whisper_log_mel(short)
    assert int(wn[1]) == one.shape[-1]
    # float64 inside: equal up to the final float32 rounding
    same: dict[str, Any] = {"rtol": 2 * EPS32, "atol": 1e-7}
    torch.testing.assert_close(wm[1, :, :int(wn[1])], one[0], **same)
    check_within("whisper_log_mel_128", wm[:1], meta, v, bounds["whisper_log_mel_128"])
    fb, fn = features.kaldi_fbank(batch, lens)
    fb1, _ = features.kaldi_fbank(short)
    torch.testing.assert_close(features.mean_normalize(fb, fn)[1, :int(fn[1])],
                               features.mean_normalize(fb1, torch.tensor([fb1.shape[1]]))[0], **same)
    w24 = _wave(v, 24000)[0]
    cut24 = (w24.numel() * 5) // 8
    b24 = torch.zeros(2, w24.numel())
    b24[0], b24[1, :cut24] = w24, w24[:cut24]
    fm, mn = features.flow_mel(b24, torch.tensor([w24.numel(), cut24]))
    fm1, _ = features.flow_mel(w24[:cut24])
    torch.testing.assert_close(fm[1, :, :int(mn[1])], fm1[0], **same)
    check_within("flow_prompt_mel_80", fm[:1], meta, v, bounds["flow_prompt_mel_80"])
