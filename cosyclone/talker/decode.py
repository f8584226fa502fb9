"""Batched talker decoding: one prefill over rows of different lengths, then cached decode steps.

Why this shape: rows are right-padded in one prefill, each with its own positions and key mask,
so every row computes exactly what it would alone (same tokens under forced/greedy sampling,
logits equal up to fp32 rounding of a different kernel shape). Each decode step feeds one token
per active row at that row's own position. Rows that finish stop being sampled at once and are
dropped from the batch (model inputs and KV cache rows) when at least half of the active rows are
done, so finished rows do not cost weight traffic for long.

One small host read per step (the sampled tokens and abort flags, (2, b) int64) drives stopping,
the silent-token filter and compaction; everything else stays on the device.

The sampler is anything that satisfies :class:`TokenSampler`; by default the RAS
``BatchSampler`` from :mod:`cosyclone.talker.sampler` (imported lazily). Each request carries its
row's seed, already derived once by the caller (manifest ``seed``, else ``row_seed(--seed, id)``),
and its segment index; the sampler draws from ``stream_key(seed, segment)`` and reports that seed
unchanged. Nothing here hashes the seed again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from .model import CosyVoice3LM

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .sampler import SamplerOptions

#: FSQ codes of silence/breath (spec 1.5); runs longer than MAX_SILENT are dropped from ``tokens``.
SILENT_TOKENS: frozenset[int] = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
MAX_SILENT = 5

LogitsHook = Callable[[Tensor, Tensor, int], Tensor]


class TokenSampler(Protocol):
    """What :func:`generate` needs from a sampler (see docs/INTERFACES.md, ``BatchSampler``)."""

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """``logits`` (b, V) fp32, ``rows`` (b,) original-row indices -> (tokens (b,), aborted (b,))."""
        ...

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        """One diagnostics object (or None) per original row."""
        ...


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
class DecodeOptions:
    """How :func:`generate` decodes."""

    sampler: SamplerOptions | None = None  # RAS options; None = SamplerOptions.from_config(model.cfg.sampling)
    custom_sampler: TokenSampler | None = None  # overrides ``sampler`` (GreedySampler, ForcedSampler, tests)
    silent_filter: bool = True  # drop silent ids after MAX_SILENT consecutive ones from ``tokens``
    max_len_override: int | None = None  # cap on generated tokens per row instead of int(20 * target_len)
    min_len_override: int | None = None  # stop ids blocked below this many tokens instead of int(2 * target_len)
    min_len_ratio: float | None = None  # min tokens = int(ratio * target_len); None = the model's (official 2)
    max_len_ratio: float | None = None  # max tokens = int(ratio * target_len); None = the model's (official 20)
    logits_hook: LogitsHook | None = None  # (logits (b,V), rows (b,), step) -> logits; fault injection
    compact_fraction: float = 0.5  # drop finished rows from the batch once this fraction of active rows is done


@dataclass
class TalkerResult:
    """What one row produced."""

    row_id: str  # the request's row_id
    tokens: list[int]  # emitted speech tokens after the silent filter (what flow gets)
    raw_tokens: list[int]  # every emitted speech token (what the LLM was fed)
    stop_reason: str  # "eos" | "max_len" | "no_finite_logits" | "error"
    diagnostics: Any = None  # SamplerRowDiagnostics from the sampler (None for simple samplers)
    min_len: int = 0  # int(2 * target_len)
    max_len: int = 0  # int(20 * target_len) or the override


# ---------------------------------------------------------------------------------------------
# Simple samplers (parity, tests, benchmarks)


def _block_stops(logits: Tensor, rows: Tensor, step: int, min_len: Tensor, stop_from: int) -> Tensor:
    """Mask every stop id (>= stop_from) for rows still below their minimum length."""
    active = (step < min_len.to(logits.device)[rows.to(logits.device)])[:, None]
    cols = torch.arange(logits.shape[1], device=logits.device)[None, :] >= stop_from
    return logits.masked_fill(active & cols, float("-inf"))


@dataclass
class GreedySampler:
    """Arg-max sampler; stop ids are blocked while a row is below its ``min_len``."""

    min_len: Sequence[int]  # per original row
    speech_token_size: int  # first stop id

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        x = _block_stops(logits.float(), rows, step, torch.as_tensor(list(self.min_len)), self.speech_token_size)
        return x.argmax(-1), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        return [None] * len(self.min_len)


@dataclass
class ForcedSampler:
    """Returns ``forced[row][step]``, then ``stop_token`` (the reference capture's sampler)."""

    forced: Sequence[Sequence[int]]  # per original row, the tokens to return in order
    stop_token: int  # returned after a row's forced tokens run out
    calls: list[tuple[list[int], int]] = field(default_factory=list)  # (rows, step) of every call

    def sample(self, logits: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        idx = rows.tolist()
        self.calls.append((idx, step))
        toks = [self.forced[r][step] if step < len(self.forced[r]) else self.stop_token for r in idx]
        return (torch.tensor(toks, dtype=torch.int64, device=logits.device),
                torch.zeros(len(idx), dtype=torch.bool, device=logits.device))

    def finish(self, stop_reasons: Sequence[str | None] | None = None,
               tokens_emitted: Sequence[int | None] | None = None) -> list[Any]:
        return [None] * len(self.forced)


# ---------------------------------------------------------------------------------------------
# Silent-token filter


def silent_filter(tokens: Sequence[int], silent: frozenset[int] = SILENT_TOKENS,
                  max_run: int = MAX_SILENT) -> list[int]:
    """Keep a silent id while the current run of consecutive silent ids is <= ``max_run``."""
    kept: list[int] = []
    run = 0
    for t in tokens:
        if t in silent:
            run += 1
            if run > max_run:
                continue
        else:
            run = 0
        kept.append(t)
    return kept


# ---------------------------------------------------------------------------------------------
# Decoding


def _make_sampler(model: CosyVoice3LM, requests: Sequence[TalkerRequest], options: DecodeOptions,
                  min_len: list[int]) -> TokenSampler:
    if options.custom_sampler is not None:
        return options.custom_sampler
    from .sampler import BatchSampler, SamplerOptions  # lazy: the sampler is another module

    opts = options.sampler or SamplerOptions.from_config(model.cfg.sampling)
    return BatchSampler(opts, row_ids=[r.row_id for r in requests], row_seeds=[r.seed for r in requests],
                        segments=[r.segment for r in requests], min_len=min_len,
                        speech_token_size=model.cfg.speech_token_size, device=model.device)


def _prompt_batch(model: CosyVoice3LM, requests: Sequence[TalkerRequest]) -> tuple[Tensor, Tensor]:
    """Right-padded assembled inputs (B, T, D) and their lengths (B,) int64 on the model device."""
    rows = [model.assemble(r.text_ids.reshape(-1).long(), r.prompt_speech_tokens.reshape(-1).long())
            for r in requests]
    lengths = torch.tensor([x.shape[0] for x in rows], dtype=torch.int64, device=model.device)
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), lengths


@torch.no_grad()
def generate(model: CosyVoice3LM, requests: Sequence[TalkerRequest],
             options: DecodeOptions | None = None) -> list[TalkerResult]:
    """Decode every request in one batch; results are in request order."""
    options = options or DecodeOptions()
    if not requests:
        return []
    cfg = model.cfg
    S = cfg.speech_token_size
    n = len(requests)
    min_ratio = cfg.min_len_ratio if options.min_len_ratio is None else options.min_len_ratio
    max_ratio = cfg.max_len_ratio if options.max_len_ratio is None else options.max_len_ratio
    min_len = [options.min_len_override if options.min_len_override is not None
               else int(min_ratio * r.target_len) for r in requests]
    max_len = [options.max_len_override if options.max_len_override is not None
               else int(max_ratio * r.target_len) for r in requests]
    sampler = _make_sampler(model, requests, options, min_len)

    embeds, lengths = _prompt_batch(model, requests)
    host_len = lengths.tolist()
    # finished rows keep advancing until compacted, so size for the longest prompt + longest decode
    model.setup_cache(n, max(host_len) + max(1, max(max_len)))
    raw: list[list[int]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    try:
        logits = model.prefill(embeds, lengths)
        active = list(range(n))  # original row of each batch row
        alive = list(range(n))  # batch rows (indices into ``active``) still being decoded
        base = lengths  # (b,) first decode position of each batch row
        dev = model.device
        step = 0
        for i, r in enumerate(range(n)):
            if max_len[r] <= 0:
                reasons[r] = "max_len"
                alive.remove(i)
        while alive:
            alive_t = torch.tensor(alive, dtype=torch.int64, device=dev)
            rows_t = torch.tensor([active[i] for i in alive], dtype=torch.int64, device=dev)
            x = logits if len(alive) == len(active) else logits.index_select(0, alive_t)
            if options.logits_hook is not None:
                x = options.logits_hook(x, rows_t, step)
            tokens, aborted = sampler.sample(x, rows_t, step)
            host_tok, host_ab = torch.stack([tokens.long(), aborted.long()]).tolist()
            still: list[int] = []
            for i, tok, ab in zip(alive, host_tok, host_ab, strict=True):
                r = active[i]
                if ab:
                    reasons[r] = "aborted"
                elif tok >= S:
                    reasons[r] = "eos"
                else:
                    raw[r].append(tok)
                    if len(raw[r]) >= max_len[r]:
                        reasons[r] = "max_len"
                    else:
                        still.append(i)
            if not still:
                break
            feed = tokens.clamp(0, cfg.decoder_size - 1).long()
            if len(alive) != len(active):  # finished-but-not-compacted rows are fed a dummy token
                full = torch.zeros(len(active), dtype=torch.int64, device=dev)
                full[alive_t] = feed
                feed = full
            if len(active) - len(still) >= max(1, options.compact_fraction * len(active)):
                keep = torch.tensor(still, dtype=torch.int64, device=dev)
                model.keep_cache_rows(keep)
                feed, base = feed.index_select(0, keep), base.index_select(0, keep)
                active = [active[i] for i in still]
                still = list(range(len(active)))
            alive = still
            positions = base + step
            kv_len = max(host_len[r] for r in active) + step + 1
            logits = model.step(model.embed_speech(feed)[:, None], positions, kv_len)
            step += 1
    finally:
        model.clear_cache()

    kept = [silent_filter(t) if options.silent_filter else list(t) for t in raw]
    diags = sampler.finish([None if x == "aborted" else x for x in reasons], [len(k) for k in kept])
    results: list[TalkerResult] = []
    for r, req in enumerate(requests):
        d = diags[r] if diags else None
        reason = reasons[r] or "max_len"
        if reason == "aborted":
            reason = getattr(d, "stop_reason", None) or "error"
        results.append(TalkerResult(row_id=req.row_id, tokens=kept[r], raw_tokens=raw[r], stop_reason=reason,
                                    diagnostics=d, min_len=min_len[r], max_len=max_len[r]))
    return results
