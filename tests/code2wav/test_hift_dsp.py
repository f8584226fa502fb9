"""HiFT's batched DSP and prepared layers against the plain torch forms they replace."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from cosyclone.code2wav.hift import CausalHiFTGenerator
from cosyclone.code2wav.hift_dsp import istft_rows, polyphase_upsample_weight, snake, stft_rows
from cosyclone.code2wav.hift_layers import CausalConv1d, CausalConv1dDownSample, CausalConv1dUpsample
from cosyclone.code2wav.noise import hift_sine_waves
from cosyclone.model.checkpoint import init_dummy
from cosyclone.model.config import HiFTConfig

WINDOW = torch.hann_window(16, periodic=True, dtype=torch.float64).to(torch.float32)


def test_stft_rows_is_torch_stft_of_each_row_alone() -> None:
    """Bytes equal: same reflect padding at each row's own end, same window multiply and FFT."""
    gen = torch.Generator().manual_seed(0)
    lens = [7, 1, 12, 3]
    sig = torch.randn(len(lens), 480 * 12, generator=gen)
    out = stft_rows(sig, torch.tensor(lens) * 480, WINDOW, 4)
    assert out.shape == (4, 18, 120 * 12 + 1)
    for b, n in enumerate(lens):
        ref = torch.stft(sig[b : b + 1, : 480 * n], 16, 4, 16, window=WINDOW, center=True, pad_mode="reflect",
                         return_complex=True)
        frames = ref.shape[-1]
        assert torch.equal(out[b, :, :frames], torch.cat([ref.real, ref.imag], dim=1)[0]), b
        assert torch.all(out[b, :, frames:] == 0)


def test_istft_rows_is_torch_istft_of_each_row_alone() -> None:
    """Each row from its own frames only (garbage past them is ignored); equal up to the FFT's
    layout-dependent rounding (relative ~1e-7)."""
    gen = torch.Generator().manual_seed(1)
    lens = [12, 2, 7]
    x = torch.randn(len(lens), 18, 120 * 12 + 1, generator=gen)
    for b, n in enumerate(lens):
        x[b, :, 120 * n + 1 :] = float("nan")
    wav = istft_rows(torch.exp(x[:, :9]), torch.sin(x[:, 9:]), torch.tensor(lens) * 120 + 1, WINDOW, 4)
    assert wav.shape == (3, 480 * 12) and torch.isfinite(wav).all()
    for b, n in enumerate(lens):
        sub = x[b : b + 1, :, : 120 * n + 1]
        mag, ph = torch.clip(torch.exp(sub[:, :9]), max=1e2), torch.sin(sub[:, 9:])
        ref = torch.istft(torch.complex(mag * torch.cos(ph), mag * torch.sin(ph)), 16, 4, 16, window=WINDOW,
                          center=True)[0]
        assert ref.shape[0] == 480 * n
        torch.testing.assert_close(wav[b, : 480 * n], ref, rtol=1e-6, atol=1e-6)
        assert torch.all(wav[b, 480 * n :] == 0)


def test_snake_bytes_are_the_official_expression() -> None:
    gen = torch.Generator().manual_seed(2)
    x, alpha = torch.randn(2, 8, 50, generator=gen) * 5, torch.rand(8, generator=gen) + 0.1
    a = alpha.view(1, -1, 1)
    assert torch.equal(snake(x, alpha), x + 1.0 / (a + 1e-9) * torch.sin(x * a).pow(2))


def test_polyphase_upsample_is_the_upsampled_conv() -> None:
    """The released (k, up) pairs and one where k < up: same result up to float rounding."""
    gen = torch.Generator().manual_seed(3)
    for k, up in ((16, 8), (11, 5), (7, 3), (3, 4)):
        w, bias, x = (
            torch.randn(6, 5, k, generator=gen),
            torch.randn(6, generator=gen),
            torch.randn(2, 5, 9, generator=gen),
        )
        ref = F.conv1d(F.pad(F.interpolate(x, scale_factor=float(up), mode="nearest"), (k - 1, 0)), w, bias)
        poly = polyphase_upsample_weight(w, up)
        taps = poly.shape[-1]
        assert taps == -(-(k - 1) // up) + 1
        got = F.conv1d(F.pad(x, (taps - 1, 0)), poly, bias.repeat(up)).view(2, up, 6, 9).permute(0, 2, 3, 1)
        torch.testing.assert_close(got.reshape(2, 6, 9 * up), ref, rtol=1e-5, atol=1e-5)


def test_prepared_convs_equal_plain_convs() -> None:
    """Each conv kind, prepared (channels-last 4-D, polyphase for the upsampler), equals itself plain."""
    gen = torch.Generator().manual_seed(4)
    for conv in (CausalConv1d(6, 4, 5, 3), CausalConv1d(6, 4, 4, causal_type="right"),
                 CausalConv1dDownSample(6, 4, 6, 3), CausalConv1dUpsample(6, 4, 7, 3)):
        x = torch.randn(2, 6, 12, generator=gen)
        with torch.no_grad():
            ref = conv(x)
            conv.prepare()
            got = conv(x.unsqueeze(2).contiguous(memory_format=torch.channels_last)).squeeze(2)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_folded_generator_equals_unfolded() -> None:
    """The whole decode with prepared layers equals the weight-norm reference path."""
    cfg = replace(HiFTConfig(), base_channels=8, f0_cond_channels=8)
    model = CausalHiFTGenerator(cfg)
    init_dummy(model, std=0.3)
    model.f0_predictor.double()
    model.noise_factory = hift_sine_waves
    mel = torch.randn(2, 80, 6, generator=torch.Generator().manual_seed(5))
    lens = torch.tensor([6, 4])
    ref, _ = model.inference(mel, lens, max_frames=0)
    model.fold_weight_norm()
    layers: Any = model  # nn.ModuleList / nn.Sequential items are typed as bare modules
    assert layers.ups[0].weight.dim() == 4 and layers.f0_predictor.condnet[0].weight.dim() == 3
    got, _ = model.inference(mel, lens, max_frames=0)
    assert ref.abs().max() > 1e-2
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
