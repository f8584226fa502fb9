"""Overlap-save FFT convolution for HiFT's long-kernel causal convs (fewer FLOPs on CPU).

Why: HiFT's convs run near the CPU's fp32 FMA peak already, so the vocoder only gets faster by
doing fewer multiply-adds. A causal conv of ``k`` taps over ``C`` channels costs ``2·k·C²`` FLOPs
per output frame done directly. Cut into blocks of ``N`` samples (``L = N − k + 1`` new outputs
per block) and moved to the frequency domain, the channel mixing is one complex ``C×C`` product
per frequency bin: ``8·(N/2+1)·C²/L`` FLOPs per frame (5-6·C² for N = 32/64 instead of 14·C² at
k = 7 and 22·C² at k = 11), plus two small real DFT products per block. The DFTs are matrices
(``dft_matrices``) applied as GEMMs, not FFT calls: at N <= 64 a GEMM over all blocks at once is
faster than many tiny FFTs and runs the same on every device.

Dilation: a causal conv with dilation ``d`` is ``d`` interleaved undilated convs (one per phase
``t mod d``), so the phases simply become more columns of the same products.

Numerics: the result equals the direct conv to fp32 rounding (relative ~1e-6 of the largest
output; tests/test_fft_conv.py pins it against ``F.conv1d``), not bit for bit: it is a different
summation, chosen at load (:meth:`cosyclone.code2wav.hift.CausalHiFTGenerator.fold_weight_norm`)
and recorded in the run's algorithm fingerprint.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def dft_matrices(size: int, kernel: int) -> tuple[Tensor, Tensor]:
    """Real DFT (N, N) and the inverse for the kept outputs (L, N), L = N − k + 1.

    Rows of the forward matrix: the two real bins first (0 and N/2, whose imaginary parts vanish
    for real signals), then ``cos``/``−sin`` per complex bin 1 .. N/2−1 (real part, imaginary part),
    so a product's rows come out as (bin, re/im) pairs after the two real ones. The inverse keeps
    only block positions ``k−1 .. N−1`` (free of circular wrap-around) and carries the 1/N and the
    factor 2 of the bins that stand for a conjugate pair. Built in float64, returned in float32.
    """
    if size <= kernel or size % 2:
        raise ValueError(f"FFT block size must be even and larger than the kernel ({kernel}), not {size}")
    n = torch.arange(size, dtype=torch.float64)
    j = torch.arange(1, size // 2, dtype=torch.float64)  # the complex bins
    angle = 2 * math.pi * j[:, None] * n[None, :] / size  # (N/2−1, N)
    complex_rows = torch.stack([torch.cos(angle), -torch.sin(angle)], dim=1).reshape(-1, size)
    forward = torch.cat([torch.ones(1, size, dtype=torch.float64), torch.cos(math.pi * n)[None], complex_rows])
    kept = n[kernel - 1:]
    angle = 2 * math.pi * kept[:, None] * j[None, :] / size  # (L, N/2−1)
    complex_cols = torch.stack([2 * torch.cos(angle), -2 * torch.sin(angle)], dim=2).reshape(len(kept), -1)
    inverse = torch.cat([torch.ones(len(kept), 1, dtype=torch.float64), torch.cos(math.pi * kept)[:, None],
                         complex_cols], dim=1) / size
    return forward.float(), inverse.float()


def spectral_weight(weight: Tensor, size: int) -> Tensor:
    """(Cout, Cin, k) causal conv weight -> (N/2+1, Cin, 2·Cout): per bin the transposed spectrum.

    Rows 0 and 1 hold the real bins 0 and N/2 (their ``Cout`` columns only; the rest is zero), rows
    2.. the complex bins 1 .. N/2−1 as ``[Re | Im]``, the order of :func:`dft_matrices`. The conv
    reads ``x[t−(k−1)+i]`` with tap ``i``; as a circular convolution over a block that is the filter
    ``h[m] = w[k−1−m]`` (taps reversed, zero past k). Computed in float64.
    """
    cout, cin, k = weight.shape
    h = weight.new_zeros(cout, cin, size, dtype=torch.float64)
    h[..., :k] = weight.double().flip(-1)
    spec = torch.fft.rfft(h, dim=-1).permute(2, 1, 0)  # (nb, Cin, Cout)
    out = torch.zeros(size // 2 + 1, cin, 2 * cout, dtype=torch.float64)
    out[0, :, :cout] = spec[0].real
    out[1, :, :cout] = spec[-1].real
    out[2:] = torch.cat([spec[1:-1].real, spec[1:-1].imag], dim=-1)
    return out.float().contiguous()


def fft_causal_conv(x: Tensor, spec: Tensor, forward: Tensor, inverse: Tensor, bias: Tensor | None, *,
                    kernel: int, dilation: int = 1) -> Tensor:
    """Causal conv (left zero padding ``dilation·(kernel−1)``) of channels-last rows by overlap-save.

    x (B, T, Cin) contiguous; spec from :func:`spectral_weight`; forward/inverse from
    :func:`dft_matrices` -> (B, T, Cout) contiguous (the prepared convs' channels-last memory).
    Equals ``conv1d(pad(x), w, bias, dilation=d)`` to fp32 rounding.
    """
    bsz, frames, cin = x.shape
    size = forward.shape[1]
    pairs = size // 2 - 1  # complex bins
    step = size - kernel + 1  # new outputs per block
    cout = spec.shape[-1] // 2
    d = dilation
    blocks = math.ceil(math.ceil(frames / d) / step)  # per phase: ceil(ceil(T/d) / L)
    padded = (blocks * step + kernel - 1) * d
    lead = (kernel - 1) * d
    xp = x.new_empty(bsz, padded, cin)
    xp[:, :lead].zero_()
    xp[:, lead + frames:].zero_()
    xp[:, lead:lead + frames] = x
    # column (b, block, phase, c) of block position n holds xp[b, (block·L + n)·d + phase, c]
    cols = xp.as_strided((size, bsz, blocks, d * cin), (d * cin, padded * cin, step * d * cin, 1))
    spectra = torch.matmul(forward, cols.reshape(size, -1))  # (N, B·blocks·d·Cin): real bins, (bin, re/im)
    m = bsz * blocks * d
    out = spectra.new_empty(size, m, cout)  # the product's spectra, rows as the input's
    torch.bmm(spectra[:2].view(2, m, cin), spec[:2, :, :cout], out=out[:2])  # real bins: Xr·Hr
    prod = torch.bmm(spectra[2:].view(pairs, 2 * m, cin), spec[2:])  # (bins, 2M, 2Cout): [Xr; Xi] @ [Hr | Hi]
    both = out[2:].view(pairs, 2, m, cout)
    torch.sub(prod[:, :m, :cout], prod[:, m:, cout:], out=both[:, 0])  # Re = Xr·Hr − Xi·Hi
    torch.add(prod[:, :m, cout:], prod[:, m:, :cout], out=both[:, 1])  # Im = Xr·Hi + Xi·Hr
    y = torch.matmul(inverse, out.view(size, m * cout))  # (L, B·blocks·d·Cout)
    # back to time order (b, block, position, phase), straight into (B, T, Cout) with the bias added
    blocked = y.view(step, bsz, blocks, d, cout).permute(1, 2, 0, 3, 4)
    rows = y.new_empty(bsz, frames, cout)
    span = step * d  # frames per block
    full = frames // span
    _copy_biased(rows[:, :full * span].view(bsz, full, step, d, cout), blocked[:, :full], bias)
    if full < blocks:  # the last block, partly past the end
        tail = blocked[:, full].reshape(bsz, span, cout)[:, :frames - full * span]
        _copy_biased(rows[:, full * span:], tail, bias)
    return rows


def _copy_biased(dst: Tensor, src: Tensor, bias: Tensor | None) -> None:
    """``dst = src (+ bias)`` in one pass."""
    if bias is None:
        dst.copy_(src)
    else:
        torch.add(src, bias, out=dst)
