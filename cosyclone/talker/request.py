"""What a decode is asked: the rows (:class:`TalkerRequest`), how (:class:`DecodeOptions`), and
what follows from both for one row: its length limits and its assembled prompt.

Kept apart from the scheduler (:mod:`cosyclone.talker.session`) so that callers that only build
requests or options (the engine's stages, conditioning) need nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cosyclone.options import CudaGraphs
from cosyclone.talker.model import CosyVoice3LM
from cosyclone.talker.step import to_device

if TYPE_CHECKING:  # pragma: no cover - typing only
    from cosyclone.talker.sampler import SamplerOptions


@dataclass(frozen=True)
class TalkerRequest:
    """One row to decode."""

    row_id: str  # stable id: names the diagnostics
    text_ids: Tensor  # (L,) int64: prompt text ids ++ target text ids
    target_len: int  # number of target text ids (min/max length are ratios of this)
    prompt_speech_tokens: Tensor  # (P,) int64 prompt speech tokens (may be empty)
    seed: int = 0  # the row's seed, used as given (the noise stream is stream_key(seed, segment))
    segment: int = 0  # index of this text segment within its row: each segment gets its own noise stream


@dataclass(frozen=True)
class StepMechanics:
    """How the decode step runs, as opposed to what it decodes: every choice here gives the same
    tokens (tests/talker/test_engine_equivalence.py pins each), so a run leaves them all at their defaults,
    chosen by device; the equivalence tests and the benchmarks vary them."""

    sync_every: int | None = None  # steps between host reads of the finished flags; None: 4 on CUDA/ROCm
    # (a read waits for the queue to drain), 1 on CPU (nothing runs ahead: a read costs nothing and a
    # finished row's slot is refilled at the next step)
    fused_admission: bool | None = None  # prefill newcomers in the pass of a decode step (step.Admit)
    # instead of apart; None: on CPU without compile or CUDA graphs (a step there is bound by reading the
    # weights once, so prompts riding along cost only their arithmetic)
    lagged_reads: bool | None = None  # read a window's finished flags after the next window is queued,
    # copied without blocking (the device never waits on the host; a slot is refilled one window later);
    # None: on CUDA/ROCm only (on CPU nothing runs ahead, so it would only delay refills)
    kv_bucket: int | None = 64
    # cells a step reads, rounded up to this (None: the whole capacity, fixed shape)
    capacity: int | None = None  # cache cells per slot (None: longest prompt + largest max_len)
    compile: str | None = None
    # torch.compile backend for the step ("inductor", "eager", ...; fullgraph=True);
    # use with kv_bucket=None (one shape) and a fixed capacity


@dataclass(frozen=True)
class DecodeOptions:
    """What :func:`~cosyclone.talker.decode.generate` and a :class:`~cosyclone.talker.session.TalkerSession`
    decode: what a run sets (engine.stages.decode_options), and how the step runs (:class:`StepMechanics`)."""

    sampler: SamplerOptions | None = None
    # RAS options; None = SamplerOptions.from_config(model.cfg.sampling)
    max_len_override: int | None = None  # cap on generated tokens per row instead of int(20 * target_len)
    min_len_override: int | None = None
    # stop ids blocked below this many tokens instead of int(2 * target_len)
    min_len_ratio: float | None = None
    # min tokens = int(ratio * target_len); None = the model's (official 2)
    max_len_ratio: float | None = None
    # max tokens = int(ratio * target_len); None = the model's (official 20)
    slots: int | None = None
    # rows decoded at once; more requests wait and take a slot as one frees (None: all)
    reserve_positions: int | None = None  # with CUDA graphs: cache cells per slot allocated up front (the
    # engine's sized figure on a GPU), so rows that fit never grow the pooled step and force a recapture
    prefill_tokens: int | None = None
    # padded prompt positions one prefill may take (newcomers x their longest
    # prompt; at least one newcomer): the sizing rule's budget on a GPU; None: every free slot at once
    cuda_graphs: CudaGraphs = "auto"
    # auto | on: capture the step as CUDA graphs (one per kv_len bucket) where
    # it can be captured (see graphs.resolve_cuda_graphs), eager otherwise; off: always eager
    mechanics: StepMechanics = StepMechanics()  # how the step runs (same tokens whatever they are)


def prompt_length(request: TalkerRequest) -> int:
    """Length of a request's assembled input: sos, text ids, task id, prompt speech tokens."""
    return int(request.text_ids.numel()) + int(request.prompt_speech_tokens.numel()) + 2


def length_limits(model: CosyVoice3LM, options: DecodeOptions, request: TalkerRequest) -> tuple[int, int]:
    """(min_len, max_len) speech tokens of a request: the overrides, else ratios of its target text ids."""
    cfg = model.cfg
    if options.min_len_override is not None:
        lo = options.min_len_override
    else:
        lo = int(
            (cfg.min_len_ratio if options.min_len_ratio is None else options.min_len_ratio)
            * request.target_len
        )
    if options.max_len_override is not None:
        hi = options.max_len_override
    else:
        hi = int(
            (cfg.max_len_ratio if options.max_len_ratio is None else options.max_len_ratio)
            * request.target_len
        )
    return lo, hi


def prompt_batch(model: CosyVoice3LM, requests: Sequence[TalkerRequest]) -> tuple[Tensor, Tensor]:
    """Right-padded assembled inputs (B, T, D) and their lengths (B,) int64 on the model device."""
    dev = model.device
    rows = [model.assemble(to_device(r.text_ids.reshape(-1).long(), dev),
                           to_device(r.prompt_speech_tokens.reshape(-1).long(), dev)) for r in requests]
    lengths = to_device([x.shape[0] for x in rows], dev)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths
