"""HiFT's signal-processing pieces, batched over rows of different lengths without host work.

Why these exist instead of ``torch.stft``/``torch.istft`` per row:
* a padded batch needs each row's centred STFT/iSTFT at the row's own length (the reflect padding
  and the overlap-add normalisation at a row's end must not see the neighbouring padding); doing
  it per row needs the lengths on the host (a sync on accelerators) and a Python loop per length;
  here the lengths stay on the device: reflect indices, frame masks and the per-row window
  envelope are computed with tensor ops, so one call serves every row;
* ``torch.istft`` overlap-adds with ``unfold_backward`` (slow on CPU: ~40% of HiFT's non-conv
  time at the released size) and checks the envelope on the host; a 16-point frame with hop 4 is
  four shifted adds;
* :func:`polyphase_upsample_weight` turns "nearest-upsample ×u, then conv k" into one conv of
  ceil((k−1)/u)+1 taps with u·Cout outputs at the input rate (3 taps instead of 16/11/7 at the
  released size: ~11 of HiFT's ~132 GFLOP per 4 s row saved, and no upsampled copy);
* :func:`snake` computes ``x + sin²(αx)/(α+1e-9)`` with one temporary instead of five.

Frame values match ``torch.stft``/``torch.istft`` (same window multiply, same FFT calls, same
summation order of the overlap-add), so the two agree.
"""

from __future__ import annotations

import torch
from torch import Tensor


def snake(x: Tensor, alpha: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Snake activation, x (B, C, ...) with alpha (C,): ``x + 1/(α+1e-9) · sin(αx)²`` (official order).

    Each step rounds exactly as the official expression (``pow(·, 2)`` is ``t·t``; products and the
    final sum are commutative), so the bytes are the same; only the temporaries are fewer. ``out``
    (x's shape, any strides, not overlapping x) receives the result instead of a new tensor.
    """
    a = alpha.view(1, -1, *([1] * (x.dim() - 2)))
    t = torch.mul(x, a) if out is None else torch.mul(x, a, out=out)
    t.sin_()
    t.mul_(t)
    t.mul_(1.0 / (a + 1e-9))
    return t.add_(x)


def polyphase_upsample_weight(weight: Tensor, up: int) -> Tensor:
    """(Cout, Cin, k) weight of "nearest ×up, left-pad k−1, conv k" -> (up·Cout, Cin, P) polyphase weight.

    Output sample ``t·up + r`` of the original reads upsampled samples ``t·up + r − (k−1) + j``, i.e.
    input frames ``t + floor((r − (k−1) + j)/up)``; taps landing on the same input frame are summed
    (in float64, then rounded once). Row ``r·Cout + c`` of the result is phase r of channel c, and
    the conv runs on the input left-padded with ``P − 1`` zeros. P = ceil((k−1)/up) + 1.
    """
    cout, cin, k = weight.shape
    taps = -(-(k - 1) // up) + 1
    w = weight.double()
    out = w.new_zeros(up, cout, cin, taps)
    for r in range(up):
        for j in range(k):
            d = (r - (k - 1) + j) // up  # in [-(taps-1), 0]
            out[r, :, :, d + taps - 1] += w[:, :, j]
    return out.reshape(up * cout, cin, taps).to(weight.dtype)


def _ola(frames: Tensor, hop: int) -> Tensor:
    """Overlap-add (B, F, n) frames at hop ``hop`` (n = q·hop) -> (B, hop·(F + q − 1)) samples.

    Block t of ``hop`` samples sums piece p of frame t − p for p = 0..q−1, added in that order
    (the order ``torch.istft``'s ``unfold_backward`` uses, so the sums round the same).
    """
    bsz, nfr, n = frames.shape
    q = n // hop
    out = frames.new_zeros(bsz, nfr + q - 1, hop)
    for p in reversed(range(q)):
        out[:, p : p + nfr] += frames[:, :, p * hop : (p + 1) * hop]
    return out.reshape(bsz, -1)


def stft_rows(sig: Tensor, n_samples: Tensor, window: Tensor, hop: int) -> Tensor:
    """Centred, reflect-padded STFT of each row at its own length, zero past its frames.

    Args:
        sig: (B, L) signals; row b's first ``n_samples[b]`` samples are valid (n_samples > 0, L % hop == 0
            is not required; frames = L // hop + 1).
        n_samples: (B,) long on ``sig``'s device.
        window: (n_fft,) analysis window.
    Returns:
        (B, n_fft + 2, L // hop + 1): [real; imag] of row b's ``n_samples[b] // hop + 1`` frames, then zeros,
        equal to ``torch.stft(sig[b, :n], n_fft, hop, window=window, center=True, pad_mode='reflect')``.
    """
    bsz, length = sig.shape
    n_fft = window.shape[0]
    half = n_fft // 2
    n = n_samples.view(-1, 1)
    idx = (torch.arange(length + 2 * half, device=sig.device) - half).abs().unsqueeze(0).expand(bsz, -1)
    idx = torch.where(idx >= n, 2 * (n - 1) - idx, idx).clamp(0, length - 1)  # reflect at each row's own end
    frames = sig.gather(1, idx).unfold(-1, n_fft, hop) * window  # (B, F, n_fft)
    spec = torch.fft.rfft(frames, dim=-1).transpose(1, 2)  # (B, n_fft/2+1, F)
    out = torch.cat([spec.real, spec.imag], dim=1)
    valid = torch.arange(out.shape[-1], device=sig.device).unsqueeze(0) <= n // hop  # (B, F)
    return torch.where(valid.unsqueeze(1), out, out.new_zeros(()))


def istft_rows(magnitude: Tensor, phase: Tensor, n_frames: Tensor, window: Tensor, hop: int) -> Tensor:
    """Centred iSTFT of each row's own frames: (B, n_fft/2+1, F) -> (B, hop·(F − 1)), zero past each row.

    Row b uses its first ``n_frames[b]`` frames and gives ``hop·(n_frames[b] − 1)`` samples, equal to
    ``torch.istft(complex(clip(mag, max=1e2)·cos(phase), …·sin(phase))[b, :, :n], n_fft, hop,
    window=window, center=True)``. Frames past a row's end (padding, possibly garbage) are dropped.
    """
    n_fft = window.shape[0]
    bsz, _, nfr = magnitude.shape
    magnitude = torch.clip(magnitude, max=1e2)
    spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    frames = torch.fft.irfft(spec.transpose(1, 2), n=n_fft, dim=-1) * window  # (B, F, n_fft)
    valid = (torch.arange(nfr, device=frames.device).unsqueeze(0) < n_frames.view(-1, 1)).unsqueeze(-1)
    frames = torch.where(valid, frames, frames.new_zeros(()))
    env = _ola(torch.where(valid, (window * window).expand(bsz, nfr, n_fft), frames.new_zeros(())), hop)
    half = n_fft // 2
    end = half + hop * (nfr - 1)
    wav = _ola(frames, hop)[:, half:end] / env[:, half:end]
    keep = torch.arange(end - half, device=wav.device).unsqueeze(0) < hop * (n_frames.view(-1, 1) - 1)
    return torch.where(keep, wav, wav.new_zeros(()))


__all__ = ["istft_rows", "polyphase_upsample_weight", "snake", "stft_rows"]
