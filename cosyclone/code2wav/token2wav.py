"""Speech tokens -> waveforms for a batch: flow, per-row speed change, HiFT (official ``token2wav``).

The official non-streaming ``CosyVoice3Model.token2wav`` changes the speaking rate after the flow,
on the mel: when ``speed != 1`` it linearly interpolates the mel along time to ``int(T / speed)``
frames (``F.interpolate(mel, size=int(T / speed), mode='linear')``, align_corners False) before
HiFT. The tokens and the flow are untouched, so a row's audio has ``int(2·tokens / speed)·480``
samples. In a batch every row has its own length and speed, so each row's valid frames are
interpolated on their own (the interpolation must not see the padding) and the results re-padded.

:func:`token2wav` is the one code path from tokens to audio: the pipeline calls it, and the
token2wav parity test runs through it, so the test proves what the pipeline does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from cosyclone.base.batching import chunks_by_length
from cosyclone.model.config import FlowConfig

#: Padded flow positions (rows x (prompt + target) tokens; the DiT sees twice as many mel frames)
#: per flow call on CPU: 8 rows of the baseline request (75 + 100 tokens). The DiT is matmul-bound
#: on CPU, so a bigger batch makes no row cheaper, and past this size it made rows dearer: measured
#: fp32 on 2 cores, 11.0 s per row at batch 1, 11.2 at batch 8, 12.7 at batch 16. Accelerators
#: run the whole batch at once.
FLOW_CPU_CHUNK_TOKENS = 1400


class MelFlow(Protocol):
    """The flow as :func:`run_flow` calls it (:class:`~cosyclone.code2wav.flow.CausalMaskedDiffWithDiT`;
    stand-ins need only what they are called with)."""

    cfg: FlowConfig

    def inference(self, token: Tensor, token_len: Tensor, prompt_token: Tensor, prompt_token_len: Tensor,
                  prompt_feat: Tensor, embedding: Tensor, *, n_timesteps: int | None = None,
                  pad_to: int = 0) -> tuple[Tensor, Tensor]: ...


class Vocoder(Protocol):
    """The vocoder as :func:`token2wav` calls it (:class:`~cosyclone.code2wav.hift.CausalHiFTGenerator`;
    ``max_frames``/``bucket`` are passed only when asked for, so stand-ins may take neither)."""

    def inference(self, mel: Tensor, mel_len: Tensor, *, max_frames: int | None = None,
                  bucket: int = 0) -> tuple[Tensor, Tensor]: ...


def run_flow(flow: MelFlow, token: Tensor, token_len: Tensor, prompt_token: Tensor, prompt_token_len: Tensor,
             prompt_feat: Tensor, embedding: Tensor, *, n_timesteps: int | None = None,
             max_tokens: int | None = None, bucket: int = 0) -> tuple[Tensor, Tensor]:
    """``flow.inference`` over length-sorted chunks of at most ``max_tokens`` padded positions.

    Same arguments and result as ``flow.inference`` (``mel (B, 80, 2 max N_b)``, ``mel_len (B,)``);
    the flow batches exactly and reads only each row's ``token_len``/``prompt_token_len`` leading
    entries, so a chunk passes the batch's padded tensors restricted to its rows and changes no
    row. ``max_tokens`` None: :data:`FLOW_CPU_CHUNK_TOKENS` on CPU, one call elsewhere; 0: one call.
    ``bucket`` > 0: each call's positions are padded up to a multiple of it (``flow.inference``'s
    ``pad_to``; ROCm, where MIOpen builds kernels per shape); 0 leaves the calls as they are.
    """
    if max_tokens is None:
        max_tokens = FLOW_CPU_CHUNK_TOKENS if token.device.type == "cpu" else 0
    totals = (token_len + prompt_token_len).tolist()
    chunks = chunks_by_length(totals, max_tokens)

    def call(*args: Tensor, longest: int) -> tuple[Tensor, Tensor]:
        if bucket <= 0:  # pad_to only when asked: stand-in flows take n_timesteps alone
            return flow.inference(*args, n_timesteps=n_timesteps)
        cap = int(flow.cfg.cfm.noise_frames // flow.cfg.token_mel_ratio)  # the noise table's length
        pad_to = max(longest, min(cap, -(-longest // bucket) * bucket))
        return flow.inference(*args, n_timesteps=n_timesteps, pad_to=pad_to)

    if len(chunks) <= 1:
        return call(token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding,
                    longest=int(max(totals, default=0)))
    rows: list[Tensor] = [token.new_zeros(0)] * int(token.shape[0])
    for chunk in chunks:
        ix = torch.tensor(chunk, dtype=torch.long, device=token.device)
        mel, mel_len = call(token[ix], token_len[ix], prompt_token[ix], prompt_token_len[ix], prompt_feat[ix],
                            embedding[ix], longest=int(max(totals[i] for i in chunk)))
        for k, b in enumerate(chunk):
            rows[b] = mel[k, :, : int(mel_len[k])]
    lens = [int(r.shape[-1]) for r in rows]
    first = rows[chunks[0][0]]
    out = first.new_zeros(len(rows), first.shape[0], max(lens))
    for b, r in enumerate(rows):
        out[b, :, : lens[b]] = r
    return out, torch.tensor(lens, dtype=token_len.dtype, device=token_len.device)


def speed_frames(frames: int, speed: float) -> int:
    """Mel frames after the speed change: ``int(frames / speed)`` as the official code computes it."""
    return int(frames / float(speed))


def change_speed(mel: Tensor, mel_len: Tensor, speed: Sequence[float]) -> tuple[Tensor, Tensor]:
    """Resample each row's mel along time by its own speed factor (``> 1`` is faster, shorter).

    Args:
        mel: ``(B, C, T)`` padded mel; row b's first ``mel_len[b]`` frames are valid.
        mel_len: ``(B,)`` valid frames per row.
        speed: ``B`` positive factors; rows with 1.0 are copied unchanged.
    Returns:
        ``mel (B, C, T')`` zero past each row's new length, ``mel_len (B,)`` with
        ``T'_b = int(mel_len[b] / speed[b])`` (the mel's padded width when every speed is 1.0).
    """
    if len(speed) != mel.shape[0]:
        raise ValueError(f"change_speed: {len(speed)} speeds for a batch of {mel.shape[0]} rows")
    if any(float(s) <= 0 for s in speed):
        raise ValueError(f"change_speed: speeds must be positive, got {list(speed)}")
    if all(float(s) == 1.0 for s in speed):
        return mel, mel_len
    lens = [int(n) for n in mel_len.tolist()]
    new_lens = [speed_frames(n, float(s)) for n, s in zip(lens, speed, strict=True)]
    out = mel.new_zeros(mel.shape[0], mel.shape[1], max(new_lens, default=0))
    for b, (n, m, s) in enumerate(zip(lens, new_lens, speed, strict=True)):
        if m <= 0:
            continue  # the official call fails here (interpolate to 0 frames); we emit no audio
        row = mel[b : b + 1, :, :n]
        out[b, :, :m] = row[0] if float(s) == 1.0 else F.interpolate(row, size=m, mode="linear")[0]
    return out, torch.tensor(new_lens, dtype=mel_len.dtype, device=mel_len.device)


@dataclass
class Token2WavResult:
    """Per-row waveforms and the wall time of each stage (for the caller to share out per row).

    ``hift_seconds`` includes the speed change (a few interpolations, negligible next to HiFT).
    """

    wavs: list[Tensor]  # B float32 CPU tensors (samples,), samples = 480 x mel frames after speed
    flow_seconds: float
    hift_seconds: float


@torch.inference_mode()
def token2wav(flow: MelFlow, hift: Vocoder, token: Tensor, token_len: Tensor, prompt_token: Tensor,
              prompt_token_len: Tensor, prompt_feat: Tensor, embedding: Tensor, *,
              speed: Sequence[float] | None = None, n_timesteps: int | None = None,
              flow_max_tokens: int | None = None, hift_max_frames: int | None = None,
              flow_bucket: int = 0, hift_bucket: int = 0) -> Token2WavResult:
    """Batched non-streaming token2wav: ``flow.inference`` -> per-row speed change -> ``hift.inference``.

    Args:
        flow: a flow with ``inference(token, token_len, prompt_token, prompt_token_len, prompt_feat,
            embedding, *, n_timesteps)`` -> ``(mel (B, 80, T), mel_len (B,))``.
        hift: a vocoder with ``inference(mel (B, 80, T), mel_len (B,))`` -> ``(wav (B, S), wav_len (B,))``.
        token: ``(B, N)`` long target tokens, ``token_len (B,)``; prompt_token ``(B, P)``,
            prompt_token_len ``(B,)``; prompt_feat ``(B, 2P, 80)``; embedding ``(B, 192)``.
        speed: one factor per row (default all 1.0, which skips the interpolation entirely).
        n_timesteps: flow Euler steps (None: the flow's configured default).
        flow_max_tokens: padded positions per flow call (see :func:`run_flow`; None: per device).
        hift_max_frames: padded mel frames per HiFT call (``hift.inference``'s ``max_frames``; None: per
        device).
        flow_bucket, hift_bucket: pad each flow call's token positions / HiFT call's mel frames up to
            a multiple of these (0: no bucketing). A row's audio changes by float rounding only, as
            with a longer batch mate: used on ROCm so that MIOpen meets few shapes.
    Returns:
        :class:`Token2WavResult` with row b's waveform trimmed to its own length.
    """
    bsz = int(token.shape[0])
    speeds = [1.0] * bsz if speed is None else [float(s) for s in speed]
    t0 = time.perf_counter()
    mel, mel_len = run_flow(flow, token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding,
                            n_timesteps=n_timesteps, max_tokens=flow_max_tokens, bucket=flow_bucket)
    mel_len = mel_len.cpu()  # also waits for the flow on an accelerator, so the timing is honest
    t1 = time.perf_counter()
    mel, mel_len = change_speed(mel, mel_len, speeds)
    extra: dict[str, int] = {}  # only what was asked: stand-in vocoders take (mel, mel_len) alone
    if hift_max_frames is not None:
        extra["max_frames"] = int(hift_max_frames)
    if hift_bucket > 0:
        extra["bucket"] = int(hift_bucket)
        mel = F.pad(mel, (0, -(-int(mel.shape[-1]) // hift_bucket) * hift_bucket - int(mel.shape[-1])))
    wav, wav_len = hift.inference(mel, mel_len.to(mel.device), **extra)
    wav, wav_len = wav.float().cpu(), wav_len.cpu()
    t2 = time.perf_counter()
    wavs = [wav[b, : int(wav_len[b])].clone() for b in range(bsz)]
    return Token2WavResult(wavs=wavs, flow_seconds=t1 - t0, hift_seconds=t2 - t1)
