"""HiFT's overlap-save FFT convs against the direct causal conv they replace."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from cosyclone.base.device import DevicePolicy
from cosyclone.code2wav.fft_conv import (
    dft_matrices,
    fft_causal_conv_padded,
    fft_margins,
    spectral_weight,
    zero_margined,
)
from cosyclone.code2wav.hift import CausalHiFTGenerator, fft_block_size, fft_rule_for
from cosyclone.code2wav.hift_layers import (
    CausalConv1d,
    CausalConv1dDownSample,
    CausalConv1dUpsample,
    Snake,
    act_conv,
)
from cosyclone.code2wav.noise import hift_sine_waves
from cosyclone.model.checkpoint import init_dummy
from cosyclone.model.config import HiFTConfig


def direct(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, d: int) -> torch.Tensor:
    """The reference: (B, T, Cin) rows, left zero padding d·(k−1), conv1d -> (B, T, Cout)."""
    k = w.shape[-1]
    return F.conv1d(F.pad(x.transpose(1, 2), (d * (k - 1), 0)), w, b, dilation=d).transpose(1, 2)


def fft_causal_conv(x: torch.Tensor, spec: torch.Tensor, forward: torch.Tensor, inverse: torch.Tensor,
                    bias: torch.Tensor | None, *, kernel: int, dilation: int = 1) -> torch.Tensor:
    """:func:`fft_causal_conv_padded` of (B, T, Cin) rows, the zero margins added here -> (B, T, Cout)."""
    bsz, frames, cin = x.shape
    lead, trail = fft_margins(frames, forward.shape[1], kernel, dilation)
    xp = zero_margined(bsz, frames, cin, lead, trail, like=x)
    xp[:, lead:lead + frames] = x
    return fft_causal_conv_padded(xp, frames, spec, forward, inverse, bias, kernel=kernel, dilation=dilation)


@pytest.mark.parametrize(("cin", "cout", "k", "d", "frames", "size", "bias"), [
    (8, 8, 11, 1, 200, 32, True),  # several blocks, a ragged last one
    (8, 8, 11, 5, 203, 64, True),  # dilation: five phases, T not a multiple of d
    (6, 10, 7, 3, 50, 16, False),  # Cin != Cout, no bias
    (4, 4, 3, 1, 5, 16, True),  # shorter than one block
    (4, 4, 7, 1, 1, 32, True),  # a single frame
])
def test_fft_conv_equals_the_direct_causal_conv(cin: int, cout: int, k: int, d: int, frames: int, size: int,
                                               bias: bool) -> None:
    gen = torch.Generator().manual_seed(frames)
    w = torch.randn(cout, cin, k, generator=gen) / (cin * k) ** 0.5
    b = torch.randn(cout, generator=gen) if bias else None
    x = torch.randn(3, frames, cin, generator=gen)
    forward, inverse = dft_matrices(size, k)
    got = fft_causal_conv(x, spectral_weight(w, size), forward, inverse, b, kernel=k, dilation=d)
    ref = direct(x, w, b, d)
    assert got.shape == ref.shape
    assert (got - ref).abs().max() <= 2e-6 * ref.abs().max()


def test_each_row_of_a_batch_is_the_row_alone() -> None:
    """No block reads a neighbouring row: rows are padded on their own."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(5, 5, 11, generator=gen)
    x = torch.randn(4, 90, 5, generator=gen)
    forward, inverse = dft_matrices(32, 11)
    spec = spectral_weight(w, 32)
    batch = fft_causal_conv(x, spec, forward, inverse, None, kernel=11, dilation=3)
    for i in range(4):
        alone = fft_causal_conv(x[i:i + 1], spec, forward, inverse, None, kernel=11, dilation=3)
        torch.testing.assert_close(batch[i:i + 1], alone, rtol=0, atol=1e-5)


def test_the_padded_form_reads_exactly_its_margins_and_refuses_other_geometry() -> None:
    """Garbage outside the margins cannot leak in (the buffer is sized to the conv's reads), the
    margins are zero, and a buffer of another size is refused rather than read out of bounds."""
    gen = torch.Generator().manual_seed(11)
    w, b = torch.randn(6, 6, 11, generator=gen), torch.randn(6, generator=gen)
    x = torch.randn(2, 61, 6, generator=gen)
    forward, inverse = dft_matrices(32, 11)
    spec = spectral_weight(w, 32)
    lead, trail = fft_margins(61, 32, 11, 3)
    assert lead == 30 and (lead + 61 + trail) % 3 == 0 and trail >= 0
    xp = zero_margined(2, 61, 6, lead, trail, like=x)
    assert xp[:, :lead].abs().max() == 0 and xp[:, lead + 61:].abs().max() == 0
    xp[:, lead:lead + 61] = x
    got = fft_causal_conv_padded(xp, 61, spec, forward, inverse, b, kernel=11, dilation=3)
    assert (got - direct(x, w, b, 3)).abs().max() <= 2e-6 * got.abs().max()
    with pytest.raises(ValueError, match="padded input"):
        fft_causal_conv_padded(xp[:, 1:], 61, spec, forward, inverse, b, kernel=11, dilation=3)


def test_batch_one_dilation_one_returns_the_inverse_output_in_place() -> None:
    """The inverse lands in time order: a single row at dilation 1 is a view, no reordering copy."""
    w = torch.randn(4, 4, 7)
    x = torch.randn(1, 50, 4)
    forward, inverse = dft_matrices(32, 7)
    got = fft_causal_conv(x, spectral_weight(w, 32), forward, inverse, None, kernel=7)
    assert got.is_contiguous() and got.shape == (1, 50, 4)
    assert got.untyped_storage().nbytes() > got.numel() * 4  # the block-padded inverse output, viewed


@pytest.mark.parametrize("make", [
    lambda: CausalConv1d(8, 8, 7, 3),  # direct, dilated
    lambda: CausalConv1d(8, 8, 3, 1),
    lambda: CausalConv1d(8, 6, 5, causal_type="right"),  # look-ahead: zeros after
    lambda: CausalConv1dUpsample(8, 4, 11, 5),
    lambda: CausalConv1dDownSample(8, 4, 6, 3),
])
def test_an_activation_written_into_the_margined_input_gives_the_same_bytes(make) -> None:
    """act_conv(x, snake, conv) == conv(snake(x)) bit for bit for direct convs: same values, same
    layout; only the padded copy is gone."""
    torch.manual_seed(0)
    conv, snake = make(), Snake(8)
    with torch.no_grad():
        snake.alpha.uniform_(0.5, 2.0)
        conv.prepare()
        x = torch.randn(3, 8, 1, 40).contiguous(memory_format=torch.channels_last)
        ref = conv(snake(x))
        got = act_conv(x, snake.into, conv)
    assert torch.equal(got, ref)


def test_block_size_must_leave_outputs() -> None:
    with pytest.raises(ValueError, match="larger than the kernel"):
        dft_matrices(8, 11)
    with pytest.raises(ValueError, match="even"):
        dft_matrices(33, 11)


def test_a_prepared_fft_conv_equals_the_prepared_direct_conv_and_keeps_its_keys() -> None:
    """Channels-last in and out, like the direct form; the spectra are derived buffers, never saved."""
    gen = torch.Generator().manual_seed(7)
    a, b = CausalConv1d(16, 16, 7, 3), CausalConv1d(16, 16, 7, 3)
    b.load_state_dict(a.state_dict())
    keys = set(a.state_dict())
    with torch.no_grad():
        a.prepare()
        b.prepare(fft_size=32)
        x = torch.randn(2, 16, 1, 300, generator=gen).contiguous(memory_format=torch.channels_last)
        ref, got = a(x), b(x)
    assert set(b.state_dict()) == keys and b.fft_spec is not None
    assert got.shape == ref.shape and got.is_contiguous(memory_format=torch.channels_last)
    assert (got - ref).abs().max() <= 2e-6 * ref.abs().max()
    with pytest.raises(ValueError, match="left-causal"):
        CausalConv1d(4, 4, 7, causal_type="right").prepare(fft_size=32)


def test_the_rule_picks_the_wide_long_convs_and_only_on_cpu() -> None:
    assert fft_block_size(64, 7) == 0 and fft_block_size(512, 3) == 0  # measured: direct wins (or ties) there
    assert all(fft_block_size(c, k) == 32 for c, k in ((64, 11), (128, 7), (128, 11), (256, 7), (256, 11)))
    cpu = DevicePolicy(device=torch.device("cpu"), dtype=torch.float32, backend="cpu", requested_dtype="fp32")
    gpu = replace(cpu, device=torch.device("cuda"), backend="cuda")
    assert fft_rule_for(cpu) is fft_block_size and fft_rule_for(gpu) is None


def test_a_generator_with_fft_convs_equals_the_direct_one() -> None:
    """The whole vocoder, every residual conv as an FFT conv (small config), against direct convs."""
    cfg = replace(HiFTConfig(), base_channels=16, f0_cond_channels=8)
    models = []
    for rule in (None, lambda c, k: 16 if k < 11 else 32):
        torch.manual_seed(0)
        model = CausalHiFTGenerator(cfg)
        init_dummy(model, std=0.3)
        model.f0_predictor.double()
        model.noise_factory = hift_sine_waves
        models.append(model.fold_weight_norm(fft=rule))
    ffts = sum(m.fft_spec is not None for m in models[1].modules() if isinstance(m, CausalConv1d))
    assert ffts == 6 * (len(models[1].resblocks) + len(models[1].source_resblocks))  # 3 dilations x 2 convs
    mel = torch.randn(3, 80, 9, generator=torch.Generator().manual_seed(5))
    lens = torch.tensor([9, 4, 7])
    ref, _ = models[0].inference(mel, lens, max_frames=0)
    got, _ = models[1].inference(mel, lens, max_frames=0)
    assert ref.abs().max() > 1e-2
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-7


def test_build_hift_uses_fft_convs_on_cpu_unless_asked_for_direct_ones() -> None:
    """Released geometry, dummy weights: the CPU build takes the rule's convs; ``direct=True`` none."""
    from cosyclone.code2wav.hift import build_hift
    from cosyclone.model.config import released_config

    cpu = DevicePolicy(device=torch.device("cpu"), dtype=torch.float32, backend="cpu", requested_dtype="fp32")
    # stages 1-2: k 7 (main + source) and k 11, 6 convs each; stage 3 (64 channels): the two k 11 blocks
    for direct, expected in ((False, 48), (True, 0)):
        model = build_hift(released_config(), cpu, load_format="dummy", direct=direct)
        assert sum(m.fft_spec is not None for m in model.modules() if isinstance(m, CausalConv1d)) == expected
