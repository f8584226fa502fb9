"""Failures confined to their rows, written once: out of memory halves, anything else isolates.

Every door into the engine (the scheduler's shared session, a batch whose frontend raised, a
row retried alone, a Ray actor's batch) goes through these functions, so a row fails the same
way, with the same record, wherever it runs. The stage-0 token checkpoint is the run's (handed in
as ``tokens``), never attached to the loaded stages: a loaded model serves many runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from cosyclone.engine import stages as stage_calls
from cosyclone.engine.outcome import Failure, RowOutcome, RowResult, failed_result, is_out_of_memory
from cosyclone.engine.stages import PreparedBatch, Stages, row_seed_of
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions
from cosyclone.talker.graph_pool import free_device_cache

if TYPE_CHECKING:  # annotations only (the stage modules load when the engine builds them)
    from cosyclone.engine.prefetch import PromptAhead
    from cosyclone.frontend.conditioning import Request
    from cosyclone.talker.request import DecodeOptions, TalkerRequest
    from cosyclone.talker.results import TalkerResult


class TokenCheckpoint(Protocol):
    """The stage-0 checkpoint a run keeps (:class:`cosyclone.folder.token_store.TokenStore` is one)."""

    def get(self, row_id: str, segment: int) -> TalkerResult | None: ...

    def put(self, row_id: str, segment: int, result: TalkerResult) -> None: ...


class BatchCalls(Protocol):
    """The stage calls a batch makes (what :class:`~cosyclone.engine.stage_ops.StageOps` gives): the
    functions here decide what to call again after a failure, never how a stage runs."""

    def prepare(self, rows: Sequence[ManifestRow], prompts: PromptAhead | None) -> PreparedBatch: ...

    def request(self, segment: Request) -> TalkerRequest: ...

    def talk(self, requests: Sequence[TalkerRequest], dec: DecodeOptions) -> list[TalkerResult]: ...

    def finish(self, prepared: PreparedBatch, results: dict[int, TalkerResult]) -> list[RowResult]: ...


__all__ = ["BatchCalls", "TokenCheckpoint", "generate_isolated", "is_out_of_memory", "rows_alone",
           "stored_results", "store_result", "synthesize_batch", "talker_with_checkpoint"]


def talker_with_checkpoint(
    calls: BatchCalls,
    segments: Sequence[tuple[str, Request]],
    dec: DecodeOptions,
    outcomes: dict[str, RowOutcome],
    tokens: TokenCheckpoint | None,
    device: torch.device,
) -> dict[int, TalkerResult]:
    """:func:`generate_isolated`, skipping segments whose talker result the stage-0 checkpoint holds
    (``tokens``) and storing the fresh ones, so a row that fails later keeps its tokens."""
    results, todo = stored_results(tokens, segments, range(len(segments)))
    fresh = generate_isolated(calls, [segments[i] for i in todo], dec, outcomes, device)
    for j, res in fresh.items():
        results[todo[j]] = res
        store_result(tokens, segments[todo[j]], res)
    return results


def stored_results(tokens: TokenCheckpoint | None, segments: Sequence[tuple[str, Request]],
                   wanted: Iterable[int]) -> tuple[dict[int, TalkerResult], list[int]]:
    """The stage-0 checkpoint's results for the ``wanted`` segment indices, and the indices it lacks."""
    results: dict[int, TalkerResult] = {}
    todo: list[int] = []
    for i in wanted:
        rid, req = segments[i]
        hit = tokens.get(rid, req.segment) if tokens is not None else None
        if hit is not None:
            results[i] = hit
        else:
            todo.append(i)
    return results, todo


def store_result(tokens: TokenCheckpoint | None, segment: tuple[str, Request], result: TalkerResult) -> None:
    """Keep a fresh talker result in the stage-0 checkpoint (when the run has one)."""
    if tokens is not None:
        tokens.put(segment[0], segment[1].segment, result)


def generate_isolated(calls: BatchCalls, segments: Sequence[tuple[str, Request]], dec: DecodeOptions,
                      outcomes: dict[str, RowOutcome], device: torch.device) -> dict[int, TalkerResult]:
    """The talker over ``segments`` -> {segment index: result}, with failures confined.

    Out of memory halves the batch and retries each half (down to one segment, which then fails
    its row); any other batch-level exception retries segment by segment, so only the segments that
    raise alone fail their rows. A row's tokens do not depend on its batch-mates, so the retries
    give the same audio as the whole batch would have. Every retry starts after the ``except``
    block has ended (a :class:`~cosyclone.engine.outcome.Failure` keeps what the records need) and,
    after an out-of-memory error, after :func:`free_device_cache`: the failed attempt's tensors are
    gone before the next attempt allocates its own.
    """
    def attempt(idx: list[int]) -> tuple[dict[int, TalkerResult], Failure | None]:
        try:
            outs = calls.talk([calls.request(segments[i][1]) for i in idx], dec)
        except Exception as exc:  # only what the records need leaves the handler: no frame, no tensor
            return {}, Failure.of(exc)
        return dict(zip(idx, outs, strict=True)), None

    def solve(idx: list[int]) -> dict[int, TalkerResult]:
        idx = [i for i in idx if outcomes[segments[i][0]].status == "ok"]
        if not idx:
            return {}
        found, failure = attempt(idx)
        if failure is None:
            return found
        if failure.oom:
            free_device_cache(device)
            if len(idx) > 1:
                half = len(idx) // 2
                return {**solve(idx[:half]), **solve(idx[half:])}
        if len(idx) == 1:
            outcomes[segments[idx[0]][0]].fail_exc("talker", failure)
            return {}
        for i in idx:  # isolate: only the segments that raise alone fail their rows
            if outcomes[segments[i][0]].status != "ok":
                continue  # an earlier segment of this row already failed alone
            one, alone = attempt([i])
            found.update(one)
            if alone is not None:
                note = f" (the batch raised {failure.describe()})"
                outcomes[segments[i][0]].fail_exc("talker", alone, note=note)
                if alone.oom:
                    free_device_cache(device)
        return found

    return solve(list(range(len(segments))))


@torch.inference_mode()
def synthesize_batch(
    calls: BatchCalls,
    stages: Stages,
    rows: Sequence[ManifestRow],
    opts: RunOptions,
    tokens: TokenCheckpoint | None = None,
    prepared: PreparedBatch | None = None,
) -> list[RowResult]:
    """One batch through every stage at once (the talker over all its segments together).

    A stage that raises for the whole batch is retried row by row (segment by segment in the
    talker), so an exception fails only the rows that raise it alone.
    """
    if prepared is None:
        prepared = calls.prepare(rows, None)
    outcomes, segments = prepared.outcomes, prepared.segments
    results: dict[int, TalkerResult] = {}
    if segments:
        t0 = time.perf_counter()
        dec = stage_calls.decode_options(stages.cfg, opts, stages.sizing)
        results = talker_with_checkpoint(calls, segments, dec, outcomes, tokens, stages.policy.device)
        share = (time.perf_counter() - t0) / max(1, len(segments))
        for rid, _ in segments:
            outcomes[rid].took("talker", share)
    return calls.finish(prepared, results)


def rows_alone(calls: BatchCalls, stages: Stages, batch: Sequence[ManifestRow], opts: RunOptions,
               exc: BaseException | Failure, tokens: TokenCheckpoint | None = None) -> list[RowResult]:
    """Each row of a batch that raised, through every stage alone; a row that still raises is a
    failed result with its traceback. ``exc``: what the batch raised (named in each failed row)."""
    batch_failure = exc if isinstance(exc, Failure) else Failure.of(exc)
    records = []
    for row in batch:
        failure = None
        try:
            records.extend(synthesize_batch(calls, stages, [row], opts, tokens))
        except Exception as exc_row:
            failure = Failure.of(exc_row)
        if failure is not None:  # after the handler: the row's frames are gone before the next row runs
            if failure.oom:
                free_device_cache(stages.policy.device)
            records.append(failed_result(row.id, row.line, row_seed_of(opts.seed, row), "pipeline", failure,
                                         note=f" (the batch raised {batch_failure.describe()})",
                                         sample_rate=int(stages.cfg.hift.sampling_rate)))
    return records
