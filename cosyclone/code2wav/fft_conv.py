"""Overlap-save FFT convolution for HiFT's long-kernel causal convs (fewer FLOPs on CPU).

Why: HiFT's direct convs run near the CPU's fp32 FMA peak already, so the vocoder only gets faster
by doing fewer multiply-adds. A causal conv of ``k`` taps over ``C`` channels costs ``2·k·C²``
FLOPs per output frame done directly. Cut into blocks of ``N`` samples (``L = N − k + 1`` new
outputs per block) and moved to the frequency domain, the channel mixing is one complex ``C×C``
product per frequency bin. Each complex product is done with three real ones (Gauss's trick:
``k1 = (Xr+Xi)·Hr``, ``k2 = Xr·(Hi−Hr)``, ``k3 = Xi·(Hr+Hi)``; ``Re = k1 − k3``, ``Im = k1 + k2``),
so a block costs ``2·N'·C²`` FLOPs with ``N' = 3·(N/2−1) + 2`` real products (the bins 0 and N/2
are real): ``3.6·C²`` per frame at N = 32, k = 7 against ``14·C²`` directly (``4.3·C²`` against
``22·C²`` at k = 11).

The sums and differences live in the transforms, not in passes of their own: the forward matrix
has a row for ``Xr+Xi`` beside ``Xr`` and ``Xi`` of each complex bin, the inverse matrix folds
``Re``/``Im`` back out of ``k1, k2, k3``. The DFTs are such matrices (:func:`dft_matrices`) applied
as batched GEMMs over blocks, not FFT calls: at N = 32 one call over all blocks beats many tiny
FFTs, runs the same on every device, and needs no transposes:

* forward: per block, ``(N', N) @ (N, Cin)`` on a strided view of the zero-margined input (the
  overlapping blocks are never copied out) -> spectra (blocks, N', Cin);
* per row of the spectra (bin, kind), one ``(blocks, Cin) @ (Cin, Cout)`` product (a bmm over N');
* inverse: per block, ``(L, N') @ (N', Cout)``, which lands in time order: (blocks, L, Cout) *is*
  (T, Cout) for dilation 1, so the result needs no reordering copy. The bias rides in bin 0
  (``N·b`` added to its product: the inverse's bin-0 column is ``1/N``).

Dilation: a causal conv with dilation ``d`` is ``d`` interleaved undilated convs (one per phase
``t mod d``), so the phases simply become more blocks (one reordering copy at the end).

Numerics: the result equals the direct conv to fp32 rounding (relative ~1e-6 of the largest
output, against ``F.conv1d``), not bit for bit: it is a different
summation, chosen at load (:meth:`cosyclone.code2wav.hift.CausalHiFTGenerator.fold_weight_norm`)
and recorded in the run's algorithm fingerprint.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def dft_matrices(size: int, kernel: int) -> tuple[Tensor, Tensor]:
    """Forward (N', N) and inverse (L, N') transforms of Gauss-product spectra, L = N − k + 1.

    Forward rows: the real bins 0 and N/2, then per complex bin 1 .. N/2−1 the three rows
    ``Re+Im``, ``Re``, ``Im`` of the DFT (``cos − sin``, ``cos``, ``−sin``). The inverse keeps only
    block positions ``k−1 .. N−1`` (free of circular wrap-around); its columns take the products
    ``k1, k2, k3`` of each complex bin (``Re = k1 − k3``, ``Im = k1 + k2``) and carry the 1/N and the
    factor 2 of a bin that stands for a conjugate pair. Built in float64, returned in float32.
    """
    if size <= kernel or size % 2:
        raise ValueError(f"FFT block size must be even and larger than the kernel ({kernel}), not {size}")
    n = torch.arange(size, dtype=torch.float64)
    j = torch.arange(1, size // 2, dtype=torch.float64)  # the complex bins
    angle = 2 * math.pi * j[:, None] * n[None, :] / size  # (N/2−1, N)
    re, im = torch.cos(angle), -torch.sin(angle)
    complex_rows = torch.stack([re + im, re, im], dim=1).reshape(-1, size)
    forward = torch.cat(
        [torch.ones(1, size, dtype=torch.float64), torch.cos(math.pi * n)[None], complex_rows]
    )
    kept = n[kernel - 1:]
    angle = 2 * math.pi * kept[:, None] * j[None, :] / size  # (L, N/2−1)
    from_re, from_im = 2 * torch.cos(angle), -2 * torch.sin(angle)  # y = Σ Re·from_re + Im·from_im
    complex_cols = torch.stack([from_re + from_im, from_im, -from_re], dim=2).reshape(len(kept), -1)
    inverse = torch.cat([torch.ones(len(kept), 1, dtype=torch.float64), torch.cos(math.pi * kept)[:, None],
                         complex_cols], dim=1) / size
    return forward.float(), inverse.float()


def spectral_weight(weight: Tensor, size: int) -> Tensor:
    """(Cout, Cin, k) causal conv weight -> (N', Cin, Cout): per row of :func:`dft_matrices` the
    matrix its spectra row is multiplied by (``Hr`` for the real bins; ``Hr``, ``Hi−Hr``, ``Hr+Hi``
    for the three rows of a complex bin), transposed for a (blocks, Cin) @ (Cin, Cout) product.

    The conv reads ``x[t−(k−1)+i]`` with tap ``i``; as a circular convolution over a block that is
    the filter ``h[m] = w[k−1−m]`` (taps reversed, zero past k). Computed in float64.
    """
    cout, cin, k = weight.shape
    h = weight.new_zeros(cout, cin, size, dtype=torch.float64)
    h[..., :k] = weight.double().flip(-1)
    spec = torch.fft.rfft(h, dim=-1).permute(2, 1, 0)  # (N/2+1, Cin, Cout)
    hr, hi = spec.real[1:-1], spec.imag[1:-1]
    gauss = torch.stack([hr, hi - hr, hr + hi], dim=1).reshape(-1, cin, cout)
    return torch.cat([spec.real[:1], spec.real[-1:], gauss]).float().contiguous()


def fft_blocks(frames: int, size: int, kernel: int, dilation: int = 1) -> int:
    """Blocks per dilation phase for ``frames`` output frames: ceil(ceil(T/d) / L)."""
    return math.ceil(math.ceil(frames / dilation) / (size - kernel + 1))


def fft_margins(frames: int, size: int, kernel: int, dilation: int = 1) -> tuple[int, int]:
    """Zero frames (before, after) ``frames`` input frames that :func:`fft_causal_conv_padded` reads:
    the causal ``d·(k−1)`` before, and after up to the last block's end."""
    step = size - kernel + 1
    lead = (kernel - 1) * dilation
    return lead, fft_blocks(frames, size, kernel, dilation) * step * dilation - frames


def fft_causal_conv_padded(xp: Tensor, frames: int, spec: Tensor, forward: Tensor, inverse: Tensor,
                           bias: Tensor | None, *, kernel: int, dilation: int = 1) -> Tensor:
    """Causal conv of zero-margined channels-last rows by overlap-save.

    xp (B, lead + T + trail, Cin) contiguous with :func:`fft_margins`' zeros around the ``frames``
    frames (Snake writes its output straight into such a buffer, so no padded copy is made here);
    spec from :func:`spectral_weight`; forward/inverse from :func:`dft_matrices` -> (B, T, Cout)
    (B = 1, dilation 1: a view of the inverse's output, already in time order; otherwise a fresh
    contiguous tensor). Equals ``conv1d(pad(x), w, bias, dilation=d)`` to fp32 rounding.
    """
    bsz, total, cin = xp.shape
    rows_f, size = forward.shape
    step = size - kernel + 1
    cout = spec.shape[-1]
    d = dilation
    blocks = fft_blocks(frames, size, kernel, d)
    lead, trail = fft_margins(frames, size, kernel, d)
    if total != lead + frames + trail:
        raise ValueError(f"padded input has {total} frames, the conv reads {lead} + {frames} + {trail}")
    m = bsz * d * blocks
    spectra = xp.new_empty(bsz, d, blocks, rows_f, cin)
    transform = forward.expand(blocks, rows_f, size)
    for b in range(bsz):
        for p in range(d):  # block (b, p, i) reads frames i·L·d + p + n·d, n < N: overlapping strided rows
            blocked = xp.as_strided((blocks, size, cin), (step * d * cin, d * cin, 1),
                                    xp.storage_offset() + (b * total + p) * cin)
            torch.bmm(transform, blocked, out=spectra[b, p])
    products = torch.bmm(spectra.view(m, rows_f, cin).transpose(0, 1), spec)  # (N', M, Cout)
    if bias is not None:
        products[0].add_(bias, alpha=size)  # the inverse's bin-0 column is 1/N
    y = torch.bmm(inverse.expand(m, step, rows_f), products.transpose(0, 1))  # (M, L, Cout): time order
    if d == 1:
        out = y.view(bsz, blocks * step, cout)[:, :frames]
        return out if bsz == 1 else out.contiguous()
    # phases back in between: frame (i·L + l)·d + p of row b is y[b, p, i, l]
    phased = y.view(bsz, d, blocks, step, cout).permute(0, 2, 3, 1, 4)  # (B, blocks, L, d, Cout)
    rows = y.new_empty(bsz, frames, cout)
    span = step * d  # frames per block
    full = frames // span
    rows[:, :full * span].view(bsz, full, step, d, cout).copy_(phased[:, :full])
    if full < blocks:  # the last block, partly past the end
        rows[:, full * span:].copy_(phased[:, full].reshape(bsz, span, cout)[:, :frames - full * span])
    return rows


def zero_margined(bsz: int, frames: int, channels: int, lead: int, trail: int, *, like: Tensor) -> Tensor:
    """An uninitialised (B, lead + T + trail, C) buffer whose ``lead`` and ``trail`` frames are zero:
    what a causal conv reads around its input (only the margins are written, not the whole buffer
    as ``F.pad`` does)."""
    buf = like.new_empty(bsz, lead + frames + trail, channels)
    buf[:, :lead].zero_()
    buf[:, lead + frames:].zero_()
    return buf
