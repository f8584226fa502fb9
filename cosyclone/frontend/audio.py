"""Prompt audio: read any soundfile format, downmix, resample with torchaudio's sinc-Hann kernel.

The official frontend resamples with ``torchaudio.transforms.Resample`` defaults (spec 2.1,
pitfall 20); torchaudio is not usable here, so the same windowed-sinc kernel is re-derived in
torch (built in float64, cached as float32 like the original) and applied as a strided conv1d.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import soundfile as sf
import torch
import torch.nn.functional as F

from cosyclone.errors import CosycloneError

MIN_SAMPLE_RATE = 16000
MAX_PROMPT_SECONDS = 30.0
# the shortest prompt the frontend takes: its 24 kHz mel reflect-pads 720 samples a side and the speech
# tokenizer needs a few 40 ms frames; shorter files fail deep in a feature extractor, so both validate and
# synth refuse them at the row
MIN_PROMPT_SECONDS = 0.1


class AudioError(CosycloneError):
    """A prompt audio file cannot be used (unreadable, too low a rate, too long, empty)."""


@dataclass(frozen=True)
class PromptBytes:
    """A prompt file's bytes as another process read them (the Ray driver ships each prompt once, so a
    worker node needs no copy of the file), with the path they were read from, which messages name.

    Decoded from memory by the same libsndfile call as the file: the same samples, so the same features."""

    path: str  # the file as the manifest resolved it
    data: bytes  # its whole content


def load_audio(path: str | Path | PromptBytes, *, row_id: str | None = None,
               min_sr: int = MIN_SAMPLE_RATE, max_seconds: float = MAX_PROMPT_SECONDS
               ) -> tuple[torch.Tensor, int]:
    """Read ``path`` (a file, or a file's :class:`PromptBytes`) → (wave (N,) float32 mono in [-1, 1],
    file sample rate).

    Stereo is averaged to mono (as the official ``load_wav``). Rates below ``min_sr`` (8 kHz
    telephone prompts) and prompts longer than ``max_seconds`` (speech tokenizer limit) are
    rejected here, naming the row, rather than failing deep inside ONNX.
    """
    where = f"row {row_id!r}: " if row_id is not None else ""
    source = io.BytesIO(path.data) if isinstance(path, PromptBytes) else str(path)
    if isinstance(path, PromptBytes):
        path = path.path
    try:
        data, sr = sf.read(source, dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several types (LibsndfileError, RuntimeError)
        raise AudioError(f"{where}cannot read prompt audio {path}: {exc}") from exc
    wave = torch.from_numpy(data).mean(dim=1) if data.shape[1] > 1 else torch.from_numpy(data[:, 0].copy())
    check_prompt(wave, int(sr), path=str(path), row_id=row_id, min_sr=min_sr, max_seconds=max_seconds)
    return wave.contiguous(), int(sr)


def check_prompt(wave: torch.Tensor, sr: int, *, path: str = "<array>", row_id: str | None = None,
                 min_sr: int = MIN_SAMPLE_RATE, max_seconds: float = MAX_PROMPT_SECONDS) -> None:
    """Validate a prompt wave (N,) at ``sr``; raise :class:`AudioError` saying what to fix."""
    where = f"row {row_id!r}: " if row_id is not None else ""
    if sr < min_sr:
        raise AudioError(f"{where}prompt audio {path} is {sr} Hz; at least {min_sr} Hz is required "
                         "(resample a wide-band recording, do not upsample telephone audio)")
    if wave.numel() == 0:
        raise AudioError(f"{where}prompt audio {path} is empty")
    seconds = wave.numel() / sr
    if seconds < MIN_PROMPT_SECONDS:
        raise AudioError(f"{where}prompt audio {path} is {wave.numel()} samples ({seconds:.3f} s); the "
                         f"frontend needs at least {MIN_PROMPT_SECONDS:g} s of speech")
    if seconds > max_seconds:
        raise AudioError(f"{where}prompt audio {path} is {seconds:.2f} s; the speech tokenizer "
                         f"accepts at most {max_seconds:g} s — trim the prompt")
    if not torch.isfinite(wave).all():
        raise AudioError(f"{where}prompt audio {path} contains NaN/inf samples")


@lru_cache(maxsize=32)
def _sinc_kernel(orig: int, new: int, width_zc: int, rolloff: float) -> tuple[torch.Tensor, int]:
    """Polyphase windowed-sinc kernels (new, 1, 2*width + orig) for reduced rates orig→new.

    Phase i of the output sits at time -i/new (in input-sample units); the low-pass cut-off is
    rolloff * min(orig, new) and the Hann window cos²(t·π/(2·width_zc)) spans ±width_zc
    zero crossings. Computed in float64 for accuracy, cached as float32.
    """
    base = min(orig, new) * rolloff
    width = math.ceil(width_zc * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64) / orig
    # torchaudio divides an integer arange here, i.e. the phase offsets -i/new are float32 values
    # (the default dtype) before the float64 sum; doing the same keeps the kernel bit-identical.
    t = (torch.arange(0, -new, -1)[:, None] / new).to(torch.float32).to(torch.float64) + idx[None, :]
    t = (t * base).clamp(-width_zc, width_zc)
    window = torch.cos(t * math.pi / width_zc / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = sinc * window * (base / orig)
    return kernel.to(torch.float32)[:, None, :], width


def resample(wave: torch.Tensor, orig_sr: int, new_sr: int, *, lowpass_filter_width: int = 6,
             rolloff: float = 0.99) -> torch.Tensor:
    """Resample (..., N) → (..., ceil(N·new/orig)) exactly like torchaudio's default Resample.

    Batched rows of equal length are fine; rows of different real length must be resampled one
    at a time (the tail depends on where each row ends).
    """
    if orig_sr == new_sr:
        return wave
    if orig_sr <= 0 or new_sr <= 0:
        raise AudioError(f"invalid sample rates {orig_sr} -> {new_sr}")
    g = math.gcd(int(orig_sr), int(new_sr))
    orig, new = int(orig_sr) // g, int(new_sr) // g
    kernel, width = _sinc_kernel(orig, new, lowpass_filter_width, rolloff)
    shape = wave.shape
    x = wave.reshape(-1, shape[-1]).to(torch.float32)
    n = x.shape[-1]
    x = F.pad(x, (width, width + orig))
    y = F.conv1d(x[:, None, :], kernel.to(x.device), stride=orig)  # (B, new, frames)
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    target = math.ceil(new * n / orig)
    return y[..., :target].reshape(*shape[:-1], -1)
