"""The schedule of a run: which batch's rows are in the talker, when a batch goes to code2wav.

One scheduler owns both schedules. ``static`` runs each planned batch through every stage before
the next (:func:`~cosyclone.engine.isolation.synthesize_batch`); ``continuous`` keeps one
:class:`~cosyclone.talker.decode.TalkerSession` across the run, adds the next batch's segments
while a slot could take them, and sends a batch to code2wav as soon as its last segment has left
the talker (on this thread, or a worker thread with its own CUDA stream). A row's tokens do not
depend on its slot mates and code2wav sees the same batches either way, so both give the same WAV
bytes. Records come out in batch order, as a generator. With prefetch one worker thread runs the
frontend of the next batch (queue depth 1) while the models work, and prompt workers compute the
prompts of the rows further ahead (:mod:`.prefetch`).

Must not: plan batches or run a stage itself; those are :mod:`.batches`' and :mod:`.stages`'.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from cosyclone.base.stop import StopRequest
from cosyclone.engine import isolation as I
from cosyclone.engine import stages as S
from cosyclone.engine.outcome import RowResult
from cosyclone.engine.prefetch import FrontendPrefetch, PromptAhead
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions
from cosyclone.talker.graph_pool import free_device_cache

if TYPE_CHECKING:  # annotations only (the stage modules load when the engine builds them)
    from cosyclone.talker.results import TalkerResult
    from cosyclone.talker.session import TalkerSession

__all__ = ["FrontendPrefetch", "StageSchedule"]

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    """A batch whose segments are (partly) in the talker."""

    rows: list[ManifestRow]
    prepared: PreparedBatch | None  # None when its frontend raised outside the per-row guards (``error``)
    results: dict[int, TalkerResult] = field(default_factory=dict)  # segment index -> talker result
    todo: set[int] = field(default_factory=set)  # segment indices still in the talker
    error: BaseException | None = None  # why the batch goes through every stage row by row instead


class StageSchedule:
    """Runs planned batches through the stages under ``opts.schedule``; :meth:`run` yields the records.

    Continuous: one :class:`~cosyclone.talker.decode.TalkerSession` across batches.

    Each turn: while fewer segments wait for a slot than there are slots, the next batch's segments
    join the session (stage-0 checkpoint hits and rows that failed in the frontend skip it); one
    decode window runs; every batch with no segment left in the talker goes to code2wav and its
    records to the writer, in batch order. If the shared session raises (out of memory, a bug),
    the segments it still held go the static way (:func:`~cosyclone.engine.isolation.generate_isolated`: halving on out
    of memory, isolation per segment) and the next batches start a fresh session.

    code2wav of a finished batch runs on this thread between decode windows (CPU: the two share
    the cores), or with ``code2wav_thread`` on a worker thread with its own CUDA stream, so the
    talker goes on meanwhile; records are emitted here either way, in batch order.
    """

    def __init__(self, stages: Stages, batches: Sequence[Sequence[ManifestRow]], opts: RunOptions, *,
                 tokens: I.TokenCheckpoint | None = None, prefetch: bool = True,
                 graph_errors: list[str] | None = None, stop: StopRequest | None = None) -> None:
        self.stages, self.batches, self.opts, self.tokens, self.prefetch = stages, batches, opts, tokens, prefetch
        self.stop = stop  # a stop request: no batch starts after it; an immediate one ends the run
        self.graph_errors = graph_errors if graph_errors is not None else []  # failed CUDA graph captures
        sizing = stages.sizing
        self.dec = S.decode_options(stages.cfg, opts)
        if sizing is not None and sizing.reserve_positions:  # GPU: the cache a slot is sized for, up front
            self.dec = replace(self.dec, reserve_positions=sizing.reserve_positions)
        self.frontend: FrontendPrefetch | None = None
        # slots: --talker-slots, else the sized count on a GPU or a batch's worth on CPU (no more than
        # the run's rows: an empty slot computes too) or, when the first batch to decode brings more
        # segments, that many
        per_batch = (sizing.talker_slots if sizing is not None and sizing.sized else None) or opts.batch_size or 8
        self.slots = max(1, opts.talker_slots or min(per_batch, sum(len(b) for b in batches)))
        self.session: TalkerSession | None = None
        self.owner: dict[int, tuple[_InFlight, int]] = {}  # ticket -> (batch, segment index)
        self.flight: list[_InFlight] = []
        self.next = 0  # next batch to feed
        threaded = opts.code2wav_thread
        if threaded is None:
            threaded = stages.policy.device.type == "cuda"
        self.finishing: list[Future[list[RowResult]]] = []
        # the worker takes this thread's torch threads (--threads): a new thread would start at torch's default
        self.code2wav = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-code2wav",
                                           initializer=torch.set_num_threads,
                                           initargs=(torch.get_num_threads(),)) if threaded else None
        device = stages.policy.device
        self.stream = torch.cuda.Stream(device) if threaded and device.type == "cuda" else None  # code2wav's own

    def run(self) -> Iterator[RowResult]:
        """The records of every planned batch, in batch order, each batch as soon as it is done."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-frontend") as pool:
            self.frontend = FrontendPrefetch(pool, self.stages, self.batches, self.opts, enabled=self.prefetch,
                                             prompts=self._prompt_workers())
            try:
                if self.opts.schedule == "static":
                    yield from self._run_static()
                else:
                    yield from self._run_continuous()
            finally:
                self.frontend.cancel()

    def _prompt_workers(self) -> PromptAhead | None:
        """Prompt workers ahead of the talker (with prefetch, for a frontend that computes prompts
        apart): as far ahead as two talker-fulls of rows, or four rows per worker, whichever is more."""
        sizing, frontend = self.stages.sizing, self.stages.frontend
        if not self.prefetch or sizing is None or not PromptAhead.usable(frontend):
            return None
        return PromptAhead(frontend, self.batches, workers=sizing.frontend_workers,
                           threads=sizing.frontend_threads,
                           ahead_rows=max(2 * self.slots, 4 * sizing.frontend_workers))

    def _run_static(self) -> Iterator[RowResult]:
        """Each batch through every stage before the next (its talker session holds that batch alone)."""
        assert self.frontend is not None
        for k, batch in enumerate(self.batches):
            if self._stopping():
                return
            prepared = self.frontend.take(k)
            with torch.inference_mode():
                try:
                    records = I.synthesize_batch(self.stages, batch, self.opts, self.tokens, prepared)
                except Exception as exc:  # a bug outside the stages' own guards: each row alone
                    records = I.rows_alone(self.stages, batch, self.opts, exc, self.tokens)
            yield from records

    def _run_continuous(self) -> Iterator[RowResult]:
        try:
            while self.next < len(self.batches) or self.flight or self.finishing:
                if self._stopping():
                    self.next = len(self.batches)  # no batch joins after a stop request
                    if self.stop is not None and self.stop.immediate:
                        return  # what is in flight is dropped, unrecorded (it runs on the resume)
                    if not self.flight and not self.finishing:
                        return
                with torch.inference_mode():
                    try:
                        self._feed()
                        self._decode()
                    except Exception as exc:  # the shared decode failed: what it held goes the per-batch way
                        self._recover(exc)
                    self._finish_ready()
                yield from self._finished(wait=not self.flight and self.next >= len(self.batches))
        finally:
            self._close_session()
            if self.code2wav is not None:
                self.code2wav.shutdown(wait=True)

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.requested

    def _feed(self) -> None:
        """Add batches while a slot could take their segments without waiting a window."""
        assert self.frontend is not None
        while self.next < len(self.batches) and (self.session is None or self.session.waiting < self.slots):
            k = self.next
            self.next += 1
            try:
                prepared = self.frontend.take(k) or self._prepare(k)
            except Exception as exc:  # outside the per-row guards: each row alone, as synthesize_batch_isolated
                self.flight.append(_InFlight(rows=list(self.batches[k]), prepared=None, error=exc))
                continue
            f = _InFlight(rows=list(self.batches[k]), prepared=prepared)
            segs = prepared.segments
            alive = [i for i, (rid, _) in enumerate(segs) if prepared.outcomes[rid].status == "ok"]
            f.results, todo = I.stored_results(self.tokens, segs, alive)
            self.flight.append(f)
            if todo:
                try:
                    reqs = [S.to_talker_request(segs[i][1]) for i in todo]
                except Exception as exc:  # a malformed segment: the batch goes row by row (the row fails alone)
                    f.prepared, f.error = None, exc
                    continue
                session = self._session(len(todo))
                tickets = session.add(reqs)
                f.todo.update(todo)
                self.owner.update({t: (f, i) for t, i in zip(tickets, todo, strict=True)})

    def _prepare(self, k: int) -> PreparedBatch:
        """Batch ``k``'s frontend on this thread (no prefetch, or the prefetch raised)."""
        prompts = self.frontend.prompts if self.frontend is not None else None
        if prompts is None:
            return S.prepare_batch(self.stages, self.batches[k], self.opts)
        return S.prepare_batch(self.stages, self.batches[k], self.opts, prompts=prompts)

    def _session(self, first: int) -> TalkerSession:
        """The open session, or a new one (``first``: segments the first batch brings)."""
        if self.session is None:
            from cosyclone.talker import decode

            if not self.opts.talker_slots:
                self.slots = max(self.slots, first)
            self.session = decode.TalkerSession(self.stages.talker, self.dec, slots=self.slots)
        return self.session

    def _decode(self) -> None:
        """One decode window; finished segments land in their batches (and the stage-0 checkpoint)."""
        if self.session is None or self.session.idle:
            return
        for t, res in self.session.poll():
            f, i = self.owner.pop(t)
            self._land(f, i, res)

    def _land(self, f: _InFlight, i: int, res: TalkerResult) -> None:
        assert f.prepared is not None  # a batch with segments in the talker was prepared
        seg = f.prepared.segments[i]
        f.results[i] = res
        f.todo.discard(i)
        I.store_result(self.tokens, seg, res)
        f.prepared.outcomes[seg[0]].took("talker", float(getattr(res, "seconds", 0.0)))

    def _recover(self, exc: BaseException) -> None:
        """Decode what the failed session held batch by batch, with the static path's isolation."""
        log.warning("talker session failed (%s: %s); its rows are decoded batch by batch", type(exc).__name__, exc)
        self._close_session()
        self.owner.clear()
        if I.is_out_of_memory(exc):  # idle pooled steps go; empty_cache unless a capture failed
            free_device_cache(self.stages.policy.device)
        for f in self.flight:
            if not f.todo:
                continue
            assert f.prepared is not None
            rest = sorted(f.todo)
            segs = f.prepared.segments
            fresh = I.generate_isolated(self.stages, [segs[i] for i in rest], self.dec, f.prepared.outcomes)
            f.todo.clear()
            for j, res in fresh.items():
                self._land(f, rest[j], res)

    def _close_session(self) -> None:
        session, self.session = self.session, None
        error = getattr(session, "graph_capture_error", None)
        if error is not None:  # the session decoded eagerly from then on: say so, and the run records it
            log.warning("CUDA graph capture failed, decoding eagerly: %s", error)
            self.graph_errors.append(str(error))
        if session is not None:
            try:
                session.close()
            except Exception:  # freeing the cache of a broken session must not hide the first error
                log.debug("closing a failed talker session raised", exc_info=True)

    def _finish_ready(self) -> None:
        """Batches with nothing left in the talker go to code2wav (in batch order)."""
        while self.flight and not self.flight[0].todo:
            f = self.flight.pop(0)
            if self.code2wav is None:
                done: Future[list[RowResult]] = Future()
                done.set_result(self._finish(f))
            else:
                done = self.code2wav.submit(self._finish_on_stream, f)
            self.finishing.append(done)

    def _finish(self, f: _InFlight) -> list[RowResult]:
        if f.prepared is None:
            assert f.error is not None
            return I.rows_alone(self.stages, f.rows, self.opts, f.error, self.tokens)
        try:
            return S.finish_batch(self.stages, f.prepared, f.results, self.opts)
        except Exception as exc:
            return I.rows_alone(self.stages, f.rows, self.opts, exc, self.tokens)

    def _finish_on_stream(self, f: _InFlight) -> list[RowResult]:
        """code2wav on its own CUDA stream (its kernels overlap the talker's), after what was queued before."""
        if self.stream is None:
            return self._finish(f)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            records = self._finish(f)
        self.stream.synchronize()
        return records

    def _finished(self, *, wait: bool) -> Iterator[RowResult]:
        """Finished batches' records in batch order (``wait``: the next one at least)."""
        while self.finishing and (wait or self.finishing[0].done()):
            yield from self.finishing.pop(0).result()
            wait = False
