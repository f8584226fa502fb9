"""Frontend features in pure torch, batched over rows of different length.

Three extractors, each matching the tool the official frontend calls (spec 2.2-2.4):

* :func:`whisper_log_mel` — speech-tokenizer input (openai-whisper ``log_mel_spectrogram``).
* :func:`kaldi_fbank` (+ :func:`mean_normalize`) — CAM++ input (torchaudio kaldi ``fbank``).
* :func:`flow_mel` — the Matcha mel the flow prompt uses (and flow/HiFT work in).

Batching rule: a padded row must give exactly what it gives alone. Edge padding (reflect) is
therefore built per row from that row's real length, and per-row statistics (whisper's global
max, the fbank mean) only see that row's valid frames.

Precision rule: every extractor takes float32 audio, computes in float64 and returns float32.
The features end in a log of band energies; a band 60-100 dB below its frame's peak holds an
energy comparable to the float32 rounding of the FFT (about eps * frame norm per bin), so a
float32 pipeline's result there depends on the FFT kernel and the CPU's vector units (AVX2,
AVX-512, AMX machines disagree in the 5th digit of single bins). In float64 that rounding is
2**29 times smaller: the result is the exactly rounded value of the function on every machine,
for the cost of a few small FFTs per prompt. Filterbanks: the Slaney bank is computed in float64
and rounded to float32 once (the values librosa / Whisper ship); the Kaldi bank, which torchaudio
computes in float32 with cancellation-prone differences of mel values, is kept exact in float64.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Filterbanks


def _hz_to_mel_slaney(f: torch.Tensor) -> torch.Tensor:
    """Slaney mel: linear below 1 kHz (200/3 Hz per mel), logarithmic above (librosa htk=False)."""
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    lin = f / f_sp
    return torch.where(f >= min_log_hz, min_log_mel + torch.log(f / min_log_hz) / logstep, lin)


def _mel_to_hz_slaney(m: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_hz_to_mel_slaney`."""
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return torch.where(m >= min_log_mel, min_log_hz * torch.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=16)
def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                          fmax: float | None = None) -> torch.Tensor:
    """librosa ``filters.mel(sr, n_fft, n_mels, fmin, fmax)`` (Slaney scale + norm) → (n_mels, 1+n_fft//2)
    float32."""
    fmax = sr / 2.0 if fmax is None else float(fmax)
    fft_freqs = torch.linspace(0, sr / 2.0, 1 + n_fft // 2, dtype=torch.float64)
    lo, hi = _hz_to_mel_slaney(torch.tensor([fmin, fmax], dtype=torch.float64))
    mel_f = _mel_to_hz_slaney(torch.linspace(float(lo), float(hi), n_mels + 2, dtype=torch.float64))
    fdiff = mel_f[1:] - mel_f[:-1]
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
    return (weights * enorm[:, None]).to(torch.float32)


@lru_cache(maxsize=8)
def kaldi_mel_banks(num_bins: int, padded_window: int, sample_freq: float, low_freq: float = 20.0,
                    high_freq: float = 0.0) -> torch.Tensor:
    """Kaldi triangular mel banks (mel = 1127·ln(1 + f/700)) → (num_bins, padded_window//2 + 1) float64.

    ``high_freq <= 0`` means Nyquist + high_freq (Kaldi convention). The last FFT bin (Nyquist)
    gets a zero column, as in Kaldi. No VTLN warping (factor 1). Exact (float64): torchaudio's
    float32 version differs from it by up to ~1e-5 per weight, depending on the CPU's ``log``.
    """
    nyquist = 0.5 * sample_freq
    if high_freq <= 0:
        high_freq += nyquist
    n_fft_bins = padded_window // 2
    bin_width = sample_freq / padded_window

    def mel(f: torch.Tensor) -> torch.Tensor:
        return 1127.0 * torch.log(1.0 + f / 700.0)

    mel_low = 1127.0 * math.log(1.0 + low_freq / 700.0)
    mel_high = 1127.0 * math.log(1.0 + high_freq / 700.0)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins, dtype=torch.float64)[:, None]
    left = mel_low + b * delta
    center = mel_low + (b + 1.0) * delta
    right = mel_low + (b + 2.0) * delta
    m = mel(bin_width * torch.arange(n_fft_bins, dtype=torch.float64))[None, :]
    up = (m - left) / (center - left)
    down = (right - m) / (right - center)
    banks = torch.clamp(torch.minimum(up, down), min=0.0)
    return F.pad(banks, (0, 1))


# ---------------------------------------------------------------------------------------------
# Helpers


def _as_batch(wave: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) or (B, N) float → ((B, N) float64 working copy, lengths (B,) long)."""
    if wave.dim() == 1:
        wave = wave[None]
    if wave.dim() != 2:
        raise ValueError(f"expected a wave (N,) or (B, N), got shape {tuple(wave.shape)}")
    wave = wave.to(torch.float64)
    if lengths is None:
        lengths = torch.full((wave.shape[0],), wave.shape[1], dtype=torch.long)
    return wave, lengths.to(torch.long).cpu()


def _reflect_pad_rows(wave: torch.Tensor, lengths: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Reflect-pad each row around its own valid span: (B, N) → (B, Nmax + left + right).

    Entries past a row's padded span are zero; frames reading them are masked by the caller.
    """
    b, n = wave.shape
    out = wave.new_zeros(b, n + left + right)
    for i in range(b):
        li = int(lengths[i])
        if li <= max(left, right):
            raise ValueError(f"row {i}: {li} samples is too short for reflect padding of {max(left, right)}")
        out[i, :li + left + right] = F.pad(wave[i:i + 1, :li][None], (left, right), mode="reflect")[0, 0]
    return out


def frame_mask(n_frames: torch.Tensor, t_max: int) -> torch.Tensor:
    """(B,) frame counts → (B, t_max) bool, True on valid frames."""
    return torch.arange(t_max)[None, :] < n_frames[:, None]


# ---------------------------------------------------------------------------------------------
# Extractors


def whisper_log_mel(wave: torch.Tensor, lengths: torch.Tensor | None = None, *, n_mels: int = 128
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Whisper log-mel of 16 kHz audio: (B, N) → (feats (B, n_mels, T), frames (B,) = len // 160).

    Centred 400-point periodic-Hann STFT (reflect 200), power, last frame dropped, Slaney mel,
    log10 floored at 1e-10, clipped to (row max − 8), then (x + 4)/4. Padded frames are 0.
    Computed in float64, returned float32 (module docstring).
    """
    n_fft, hop = 400, 160
    wave, lengths = _as_batch(wave, lengths)
    padded = _reflect_pad_rows(wave, lengths, n_fft // 2, n_fft // 2)
    window = torch.hann_window(n_fft, dtype=torch.float64, device=wave.device)
    stft = torch.stft(padded, n_fft, hop, window=window, center=False, return_complex=True)
    frames = lengths // hop
    t_max = int(frames.max())
    power = stft[..., :t_max].abs() ** 2
    filters = slaney_mel_filterbank(16000, n_fft, n_mels).to(device=wave.device, dtype=torch.float64)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    mask = frame_mask(frames, t_max).to(wave.device)[:, None, :]
    row_max = log_spec.masked_fill(~mask, float("-inf")).amax(dim=(1, 2), keepdim=True)
    log_spec = torch.maximum(log_spec, row_max - 8.0)
    log_spec = ((log_spec + 4.0) / 4.0).masked_fill(~mask, 0.0)
    return log_spec.to(torch.float32), frames


def kaldi_fbank(wave: torch.Tensor, lengths: torch.Tensor | None = None, *, num_mel_bins: int = 80,
                sample_frequency: float = 16000.0, frame_length_ms: float = 25.0,
                frame_shift_ms: float = 10.0, preemph: float = 0.97
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Kaldi fbank as torchaudio's ``compliance.kaldi.fbank`` defaults (dither 0): (B, N) → ((B, T, bins), T
    (B,)).

    snip_edges framing (T = 1 + (N − 400)//160), per-frame DC removal, pre-emphasis 0.97 with
    the first sample replicated, Povey window (Hann^0.85, symmetric), zero-pad to 512, power
    spectrum, Kaldi mel banks 20 Hz..Nyquist, ln floored at float32 eps. Float input, no ×32768.
    Computed in float64, returned float32 (module docstring).
    """
    wave, lengths = _as_batch(wave, lengths)
    win = int(sample_frequency * frame_length_ms * 0.001)
    shift = int(sample_frequency * frame_shift_ms * 0.001)
    padded_win = 1 << (win - 1).bit_length()
    frames = torch.where(lengths >= win, 1 + (lengths - win) // shift, torch.zeros_like(lengths))
    if int(frames.min()) <= 0:
        raise ValueError(f"a row is shorter than one {frame_length_ms} ms frame")
    t_max = int(frames.max())
    x = wave
    need = (t_max - 1) * shift + win
    if x.shape[1] < need:
        x = F.pad(x, (0, need - x.shape[1]))
    strided = x.unfold(1, win, shift)[:, :t_max]  # (B, T, win)
    strided = strided - strided.mean(dim=-1, keepdim=True)
    prev = torch.cat([strided[..., :1], strided[..., :-1]], dim=-1)
    strided = strided - preemph * prev
    window = torch.hann_window(win, periodic=False, dtype=torch.float64, device=wave.device).pow(0.85)
    strided = F.pad(strided * window, (0, padded_win - win))
    power = torch.fft.rfft(strided).abs().pow(2.0)
    banks = kaldi_mel_banks(num_mel_bins, padded_win, float(sample_frequency)).to(wave.device)
    mel = power @ banks.T
    eps = torch.finfo(torch.float32).eps
    feats = torch.clamp(mel, min=eps).log()
    mask = frame_mask(frames, t_max).to(wave.device)[..., None]
    return feats.masked_fill(~mask, 0.0).to(torch.float32), frames


def mean_normalize(feats: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """Subtract each row's per-bin mean over its valid frames: (B, T, D) → (B, T, D), pads stay 0.

    The mean is accumulated in float64; the result has the input's dtype.
    """
    mask = frame_mask(frames, feats.shape[1]).to(feats.device)[..., None]
    x = feats.to(torch.float64)
    mean = (x * mask).sum(dim=1, keepdim=True) / frames.to(feats.device)[:, None, None].to(torch.float64)
    return (x - mean).masked_fill(~mask, 0.0).to(feats.dtype)


def flow_mel(wave: torch.Tensor, lengths: torch.Tensor | None = None, *, n_fft: int = 1920,
             num_mels: int = 80, sampling_rate: int = 24000, hop_size: int = 480, win_size: int = 1920,
             fmin: float = 0.0, fmax: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Matcha ``mel_spectrogram`` (center False): (B, N) → (mel (B, num_mels, T), T (B,) = N // hop).

    Reflect-pad (n_fft − hop)/2 per row, periodic-Hann STFT, magnitude sqrt(re²+im²+1e-9), Slaney
    mel with fmax None = Nyquist (not CosyVoice2's 8 kHz), ln of max(x, 1e-5). Pads are ln(1e-5).
    Transpose to (B, T, 80) for the frontend layout. Computed in float64, returned float32.
    """
    wave, lengths = _as_batch(wave, lengths)
    pad = (n_fft - hop_size) // 2
    padded = _reflect_pad_rows(wave, lengths, pad, pad)
    window = torch.hann_window(win_size, dtype=torch.float64, device=wave.device)
    spec = torch.stft(padded, n_fft, hop_size, win_length=win_size, window=window, center=False,
                      return_complex=True)
    spec = torch.view_as_real(spec)
    mag = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    frames = (lengths + 2 * pad - n_fft) // hop_size + 1
    t_max = int(frames.max())
    basis = slaney_mel_filterbank(sampling_rate, n_fft, num_mels, fmin, fmax).to(wave.device, torch.float64)
    mel = torch.log(torch.clamp(basis @ mag[..., :t_max], min=1e-5))
    mask = frame_mask(frames, t_max).to(wave.device)[:, None, :]
    return mel.masked_fill(~mask, math.log(1e-5)).to(torch.float32), frames


def align_prompt(speech_feat: torch.Tensor, speech_token: torch.Tensor, token_mel_ratio: int = 2
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Trim prompt mel (Tm, 80) and tokens (P0,) to L = min(Tm // ratio, P0) tokens, ratio·L frames.

    Flow takes mel_len1 from prompt_feat, so it must be exactly ratio × prompt tokens (spec 2.5).
    """
    n = min(speech_feat.shape[0] // token_mel_ratio, speech_token.shape[0])
    return speech_feat[:token_mel_ratio * n], speech_token[:n]
