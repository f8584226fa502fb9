"""What a decode gives back: one :class:`TalkerResult` per row, made from its slot's harvest.

A finished slot's tokens and sampler counters reach the host in one read (:class:`Harvest`);
here they become the row's result: the silent-token filter applied (spec 1.5: runs of silence
or breath codes longer than :data:`MAX_SILENT` are dropped from what code2wav gets, while the
talker was fed every token), the engine's stop code named, the in-step sampler's counters turned
into :class:`~cosyclone.talker.diagnostics.SamplerRowDiagnostics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from cosyclone.talker.diagnostics import SamplerRowDiagnostics, StopReason
from cosyclone.talker.request import TalkerRequest
from cosyclone.talker.sampler import COUNTER_NAMES, SamplerOptions, row_diagnostics
from cosyclone.talker.step import REASONS, Harvest

#: FSQ codes of silence/breath (spec 1.5); runs longer than MAX_SILENT are dropped from ``tokens``.
SILENT_TOKENS: frozenset[int] = frozenset({1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323})
MAX_SILENT = 5
#: sampler state of a request that never took a slot (max_len <= 0): no counters, no error
_NEVER = [0] * len(COUNTER_NAMES) + [0, -1, 0, 0]


@dataclass
class TalkerResult:
    """What one row produced."""

    row_id: str  # the request's row_id
    tokens: list[int]  # emitted speech tokens after the silent filter (what flow gets)
    raw_tokens: list[int]  # every emitted speech token (what the LLM was fed)
    stop_reason: StopReason  # "eos" | "max_len" | "no_finite_logits" | "error"
    diagnostics: SamplerRowDiagnostics | None = None  # the sampler's counters for this row
    min_len: int = 0  # int(2 * target_len)
    max_len: int = 0  # int(20 * target_len) or the override
    seconds: float = 0.0  # decode wall time shared out over the rows in the slots, window by window


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


def harvest_tokens(h: Harvest | None) -> tuple[list[int], list[int], str]:
    """A slot's raw tokens, the tokens kept by the silent filter, and its engine stop reason
    ("eos", "max_len", "aborted"; "max_len" for a request that never took a slot: ``h`` None)."""
    raw = h.tokens if h is not None else []
    kept = silent_filter(raw)  # the official post-filter; the raw tokens stay beside them
    return raw, kept, REASONS[h.reason] if h is not None else "max_len"


def talker_result(
    req: TalkerRequest,
    h: Harvest | None,
    sampler: SamplerOptions,
    *,
    min_len: int,
    max_len: int,
    seconds: float,
    graph_steps: int,
) -> TalkerResult:
    """One row's result from its harvest (``h`` None: it never took a slot). A row the sampler
    aborted gets the sampler's reason ("no_finite_logits" / "error"); ``graph_steps`` (steps its
    slot ran as a graph replay) is capped at the row's own steps (a slot held past its end adds none)."""
    raw, kept, reason = harvest_tokens(h)
    state = h.sampler_state if h is not None else _NEVER
    ended = None if reason == "aborted" else cast(StopReason, reason)  # eos | max_len
    diag = row_diagnostics(sampler, req.row_id, req.seed, req.segment, state[:-4], dead=reason == "aborted",
                           err=state[-4:], stop_reason=ended, tokens_emitted=len(kept))
    stop: StopReason = ended or diag.stop_reason or "error"
    diag.graph_steps = min(graph_steps, diag.steps)
    return TalkerResult(row_id=req.row_id, tokens=kept, raw_tokens=raw, stop_reason=stop, diagnostics=diag,
                        min_len=min_len, max_len=max_len, seconds=seconds)
