"""How far a float32 evaluation of a log-filterbank feature can be from its exact value.

The frontend parity vectors were computed by the official tools in float32; cosyclone computes
the same functions in float64 (``cosyclone/frontend/features.py``), so the difference a parity
test sees is the *reference's own* float32 rounding. That rounding is tiny in loud bands and
large in bands far below their frame's peak, where the log amplifies it: a single global
tolerance is either too loose for the loud bands or fails on the quiet ones (by how much depends
on the CPU that made the vectors and on the input, so it breaks on vector sets not seen yet).
These functions give, per output element, an upper bound of that rounding, derived from the
input alone (never from the outputs under test), so a test can demand agreement within it.

The error model, per frame of ``n`` raw samples ``v`` (float32 unit roundoff ``u = 2**-24``,
written ``eps = 2u`` below):

1. DFT. Any FFT evaluated in float32 satisfies ``||X^ - X||_2 <= c * log2(n) * eps * ||X||_2``
   (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm. 24.2; c ~ 1 for
   accurate twiddles), and ``||X||_2 = sqrt(n) * ||w||_2 <= sqrt(n) * ||v||_2`` (Parseval; the
   windowed frame ``w`` is never larger than the raw frame: windows are <= 1, DC removal is a
   projection, pre-emphasis adds at most 0.97x). One bin can carry all of the error, so
   ``|dX_k| <= delta = (log2(n) * sqrt(n) + 4) * eps * ||v||_2``; the ``+ 4`` covers the
   elementwise steps before the FFT (window product, DC removal, pre-emphasis, padding), each
   within ``eps * |v|`` per sample. This is the worst case, not a fit to data: on the public
   vectors the observed errors use 1/10 to 1/25 of it, and an error model fitted to them would
   not transfer to another input or another FFT kernel.
2. Band energy. Power ``|X_k|^2`` moves by at most ``2 |X_k| delta + delta^2``; a magnitude
   ``sqrt(|X_k|^2 + c)`` by at most ``delta`` (1-Lipschitz in ``|X_k|``). A band sums ``nnz``
   nonnegative weighted terms: relative summation error <= ``nnz * eps``; + 4 eps for the
   products, the clamp and the log.
3. Filterbank. Where the reference computes its bank in float32 (torchaudio's Kaldi bank),
   each weight ``(m_k - left) / (center - left)`` is a difference of mel values up to
   ``mel_high`` divided by the band spacing ``delta_mel``: absolute weight error <=
   ``10 * eps * mel_high / delta_mel`` (numerator <= 6 eps mel_high, denominator <= 4 eps
   mel_high); a weight that should be 0 can become that small value, so the bound sums the
   power over the band's support widened by one bin. (Slaney banks are computed in float64 by
   librosa and stored as float32: relative error <= eps/2, inside the 4 eps of step 2.)
4. Log. ``|ln a - ln b| <= |a - b| / min(a, b)`` and a clamp at a floor ``f`` is 1-Lipschitz,
   so the log error is <= ``dE / max(E - dE, f)``. Whisper's ``max(x, max - 8)`` moves by at
   most the error of x plus that of the maximum.
5. Output. Both results are float32 numbers: + 2 eps |value|.

Which CPU. Each step bounds *every* float32 evaluation order and every accurate FFT algorithm,
so the bound does not depend on the kernel that made the vectors or the one a test runs on:
AVX2-only AMD EPYC (where the old global tolerances failed by single outlier bins), AVX-512
Zen 4 (where this was written and run) and Intel Xeon with AMX differ only in summation order
and FFT radix, which the worst case already covers. AMX itself has no float32 arithmetic; torch
keeps float32 matmuls in float32 unless the matmul precision is lowered, and
``cosyclone.base.device`` pins it to "highest". The flow, LLM and HiFT parity tests compare two
float32 runs instead (ours here, the official one on the capture machine): there
``|ours - ref| <= |ours - exact| + |ref - exact|``, both terms of the order of the float32 noise
the vectors' JSON measured on the capture machine (``float32_noise``), which another kernel changes
in summation order but not in size (it grows like ``sqrt(K) * eps * |x|`` with reduction length
``K`` for any order); their 10-20x margins over that noise cover both terms on any of these CPUs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

EPS32 = torch.finfo(torch.float32).eps


def dft_bin_error(raw_frames: Tensor, n_fft: int) -> Tensor:
    """Step 1: bound ``delta`` on the float32 error of any single bin: raw frames (T, n) → (T,)."""
    return (math.log2(n_fft) * math.sqrt(n_fft) + 4.0) * EPS32 * raw_frames.to(torch.float64).norm(dim=-1)


def _support(banks: Tensor, widen: int) -> Tensor:
    """Nonzero pattern of each band (M, K), widened by ``widen`` bins on each side, as float64."""
    nz = (banks > 0).to(torch.float64)[None]
    if widen:
        nz = torch.nn.functional.max_pool1d(nz, 2 * widen + 1, stride=1, padding=widen)
    return nz[0]


def power_log_bound(spec: Tensor, delta: Tensor, banks: Tensor, *, floor: float,
                    bank_weight_error: float = 0.0) -> Tensor:
    """Bound (T, M) on |float32 - exact| of ``ln(max(banks @ |spec|^2, floor))``.

    ``spec`` (T, K) complex exact spectrum, ``delta`` (T,) from :func:`dft_bin_error`, ``banks``
    (M, K) exact weights; ``bank_weight_error`` is step 3's per-weight bound (0 for exact banks).
    """
    banks = banks.to(torch.float64)
    mag = spec.abs()
    power = mag.square()
    energy = power @ banks.T
    d = delta[:, None]
    err = (2.0 * mag * d + d.square()) @ banks.T
    err = err + bank_weight_error * (power @ _support(banks, 1).T)
    err = err + ((banks > 0).sum(1).to(torch.float64) + 4.0) * EPS32 * energy
    return err / torch.clamp(energy - err, min=floor)


def magnitude_log_bound(spec: Tensor, delta: Tensor, banks: Tensor, *, floor: float, offset: float) -> Tensor:
    """Bound (T, M) on |float32 - exact| of ``ln(max(banks @ sqrt(|spec|^2 + offset), floor))``."""
    banks = banks.to(torch.float64)
    energy = torch.sqrt(spec.abs().square() + offset) @ banks.T
    err = delta[:, None] * banks.sum(1)[None, :]
    err = err + ((banks > 0).sum(1).to(torch.float64) + 4.0) * EPS32 * energy
    return err / torch.clamp(energy - err, min=floor)


def output_rounding(values: Tensor) -> Tensor:
    """Step 5: both sides are float32 numbers."""
    return 2.0 * EPS32 * values.to(torch.float64).abs()


def float32_noise(meta: dict, *prefixes: str) -> float:
    """Largest ``tolerance_observed.fp64_vs_fp32_maxabs`` of the outputs starting with ``prefixes``:
    how far the official float32 computation itself is from its float64 twin on this vector set."""
    gaps = meta.get("tolerance_observed", {}).get("fp64_vs_fp32_maxabs", {})
    values = [v for k, v in gaps.items() if isinstance(v, (int, float)) and k.startswith(prefixes or ("",))]
    return float(max(values, default=0.0))
