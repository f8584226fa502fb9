"""The run's pipeline: prompt workers -> the talker's session -> code2wav, fed part by part.

One :class:`StageSchedule` lives for a whole run: the manifest's parts feed it (:meth:`feed`),
its prompt workers, frontend thread and talker session live across them, and :meth:`drain`
finishes what is in flight. ``continuous`` keeps one talker session: each turn admits the next
prepared batches' segments while a slot could take them, runs one decode window, and sends every
batch whose segments all left the talker to code2wav (on this thread, or on a worker thread with
its own CUDA stream), records in batch order. It never waits while there is work: a batch is
admitted only once its frontend is done, and the frontend is waited for only when the talker has
nothing in its slots. ``static`` runs each batch through every stage before the next. A row's
tokens do not depend on its slot mates and code2wav sees the same batches either way, so both
give the same WAV bytes.

If the shared session raises (out of memory, a bug), recovery starts after the ``except`` block
ends (a traceback keeps the failed frames' tensors alive): the session is closed, the device's
cache freed (:func:`~cosyclone.talker.graph_pool.free_device_cache`), and the segments it held go
the isolated way (out of memory halves down to the rows that cannot fit; anything else retries
segment by segment); the next batches open a fresh session. The time each stage was busy or
waiting is kept by a :class:`~cosyclone.engine.clock.StageClock`.

Must not: plan batches or run a stage itself (:mod:`.batches`, :mod:`.stage_ops`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from cosyclone.base.stop import StopRequest
from cosyclone.base.streams import code2wav_stream
from cosyclone.engine import isolation as I
from cosyclone.engine import stages as S
from cosyclone.engine.batch_window import BatchWindow
from cosyclone.engine.clock import StageClock, TalkerState
from cosyclone.engine.outcome import Failure, RowResult
from cosyclone.engine.prefetch import FrontendPrefetch, PromptAhead
from cosyclone.engine.stage_ops import RealOps, StageOps, TalkerSessionLike
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions
from cosyclone.talker.graph_pool import PROCESS, free_device_cache

if TYPE_CHECKING:
    from cosyclone.talker.results import TalkerResult

__all__ = ["FrontendPrefetch", "StageSchedule"]

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    """A batch whose segments are (partly) in the talker."""

    rows: list[ManifestRow]
    prepared: PreparedBatch | None  # None when its frontend raised outside the per-row guards (``error``)
    results: dict[int, TalkerResult] = field(default_factory=dict)  # segment index -> talker result
    todo: set[int] = field(default_factory=set)  # segment indices still in the talker
    error: Failure | None = None  # why the batch goes through every stage row by row instead


class StageSchedule:
    """One run's pipeline (see the module docstring); :meth:`feed` and :meth:`drain` yield the records."""

    def __init__(
        self,
        stages: Stages,
        opts: RunOptions,
        *,
        tokens: I.TokenCheckpoint | None = None,
        prefetch: bool = True,
        graph_errors: list[str] | None = None,
        stop: StopRequest | None = None,
        ops: StageOps | None = None,
        clock: StageClock | None = None,
        ordered: bool = True,
    ) -> None:
        """``ops``: the stage calls (default: the loaded stages'); ``clock``: the stage accounting;
        ``ordered``: records in batch order (False: a batch goes to code2wav as soon as its segments are
        out, so a long row holds only its own batch; a run folder takes records in any order)."""
        self.stages, self.opts, self.tokens, self.prefetch = stages, opts, tokens, prefetch
        self.stop = stop  # a stop request: no batch starts after it; an immediate one ends the run
        self.graph_errors = graph_errors if graph_errors is not None else []  # failed CUDA graph captures
        sizing = stages.sizing
        self.dec = S.decode_options(stages.cfg, opts, sizing)  # on a GPU with the sizing rule's caps
        self.ops: StageOps = ops if ops is not None else RealOps(stages, opts, self.dec, tokens)
        workers = sizing.frontend_workers if sizing is not None else 1
        self.clock = clock if clock is not None else StageClock(frontend_workers=workers,
                                                                 shared_device=self.ops.shared_device)
        self.ordered = ordered
        # the batches fed and not yet admitted, by run index (the admitted ones are forgotten)
        self.batches = BatchWindow()
        self.unadmitted = 0  # rows of the fed batches not yet admitted
        self.slots = 0  # talker slots, set at the first feed
        self.session: TalkerSessionLike | None = None
        self.owner: dict[int, tuple[_InFlight, int]] = {}  # ticket -> (batch, segment index)
        self.flight: list[_InFlight] = []
        self.next = 0  # next batch to admit
        self.finishing: list[tuple[Future[list[RowResult]], int]] = []  # code2wav's backlog: (records, rows)
        self.frontend: FrontendPrefetch | None = None
        self.prompt_workers: PromptAhead | None = None
        self._pool: ThreadPoolExecutor | None = None
        threaded = opts.code2wav_thread
        if threaded is None:
            threaded = stages.policy.device.type == "cuda"
        # the worker takes this thread's torch threads (--threads): a new thread would start at torch's
        # default
        self.code2wav = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-code2wav",
                                           initializer=torch.set_num_threads,
                                           initargs=(torch.get_num_threads(),)) if threaded else None
        device = stages.policy.device
        self.stream = code2wav_stream(device) if threaded and device.type == "cuda" else None  # the process's

    # -- the run's doors ---------------------------------------------------------------------------------

    def run(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        """Every record of ``batches``, in batch order: one part fed, drained, closed."""
        try:
            yield from self.feed(batches)
            yield from self.drain()
        finally:
            self.close()

    def feed(self, batches: Sequence[Sequence[ManifestRow]]) -> Iterator[RowResult]:
        """Add one part's ``batches``; yields records until each of them is admitted (the tail stays in
        flight for the next part or :meth:`drain`)."""
        self.batches.extend(batches)
        fed = sum(len(b) for b in batches)
        self.unadmitted += fed
        self._start()
        # never more than half a part held back: small parts run as they come (a first row comes out early)
        self.holding = min(self.reserve, fed // 2)
        assert self.frontend is not None
        self.frontend.fill()
        if self.opts.schedule == "static":
            yield from self._run_static()
        else:
            yield from self._turns(final=False)

    def drain(self) -> Iterator[RowResult]:
        """Every record still in flight (the last part's batches not yet admitted included)."""
        if self.opts.schedule == "continuous" and self.frontend is not None:
            yield from self._turns(final=True)

    def close(self) -> None:
        """Free what the pipeline holds (workers, session, code2wav thread); safe to call twice."""
        if self.frontend is not None:
            self.frontend.cancel()
        self.frontend = self.prompt_workers = None  # (they refer back to this pipeline: no cycle outlives it)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._close_session()
        if self.code2wav is not None:
            self.code2wav.shutdown(wait=True)
        reason = PROCESS.disabled  # a capture failure anywhere in the process (static, retries, the session)
        if reason is not None and not any(reason in e for e in self.graph_errors):
            self.graph_errors.append(reason)

    def _start(self) -> None:
        """At the first feed: the slots, the frontend thread and the prompt workers, once per run."""
        if self.frontend is not None:
            return
        sizing, opts = self.stages.sizing, self.opts
        # slots: --talker-slots, else the sized count on a GPU or a batch's worth on CPU (no more than the
        # first part's rows: an empty slot computes too) or, when the first batch brings more segments, that
        # many
        per_batch = (
            (sizing.talker_slots if sizing is not None and sizing.sized else None) or opts.batch_size or 8
        )
        self.slots = max(1, opts.talker_slots or min(per_batch, self.batches.rows_from(0)))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-frontend")
        frontend = self.stages.frontend
        if self.prefetch and sizing is not None and PromptAhead.usable(frontend):
            self.prompt_workers = PromptAhead(frontend, self.batches, workers=sizing.frontend_workers,
                                              threads=sizing.frontend_threads,
                                              ahead_rows=max(2 * self.slots, 4 * sizing.frontend_workers),
                                              on_seconds=functools.partial(self.clock.add, "prompts"))
        self.frontend = FrontendPrefetch(self._pool, self._prepare_timed, self.batches, enabled=self.prefetch,
                                         prompts=self.prompt_workers)
        # feed() hands back while this many rows are still to admit: the driver brings the next part
        # before the look-ahead (prompt workers, frontend) runs dry at the part's end
        ahead = self.prompt_workers.ahead_rows if self.prompt_workers is not None else 0
        self.reserve = ahead + self.frontend.depth * per_batch if self.prefetch else 0
        self.holding = 0  # rows this part's feed leaves to admit (at most the reserve)
        # code2wav's backlog, in rows: beyond it the talker waits for code2wav (host memory stays bounded
        # and a stop drains a bounded amount)
        self.backlog_rows = max(4 * self.slots, 2 * per_batch, 64)
        self.clock.start()

    def _prepare_timed(self, rows: Sequence[ManifestRow]) -> PreparedBatch:
        prompts = self.prompt_workers
        prepared = self.clock.timed("frontend", lambda: self.ops.prepare(rows, prompts))
        assert isinstance(prepared, PreparedBatch)
        return prepared

    def _stopping(self) -> bool:
        return self.stop is not None and self.stop.requested

    # -- static ------------------------------------------------------------------------------------------

    def _run_static(self) -> Iterator[RowResult]:
        """Each batch through every stage before the next (its talker session holds that batch alone)."""
        assert self.frontend is not None
        while self.next < len(self.batches):
            if self._stopping():
                return
            k, batch = self.next, self.batches[self.next]
            self._admitted(k)
            prepared = self.frontend.take(k)
            failure: Failure | None = None
            with torch.inference_mode():
                try:
                    records = I.synthesize_batch(self.ops, self.stages, batch, self.opts, self.tokens,
                                                 prepared)
                except Exception as exc:  # a bug outside the stages' own guards: each row alone, after this
                    failure = Failure.of(exc)
                if failure is not None:
                    records = self.ops.rows_alone(batch, failure)
            yield from records

    # -- continuous --------------------------------------------------------------------------------------

    def _admitted(self, k: int) -> None:
        """Batch ``k`` leaves the window of batches to admit (with those before it no reader still wants)."""
        self.next = k + 1
        self.unadmitted -= len(self.batches[k])
        keep = self.next
        if self.prompt_workers is not None:  # the prompt look-ahead counts and submits batches in order
            keep = min(keep, self.prompt_workers.counted, self.prompt_workers.submitted_batches)
        self.batches.forget_before(keep)

    def _turns(self, *, final: bool) -> Iterator[RowResult]:
        """Turns until the fed batches are admitted down to the look-ahead's reserve (``final``: all of
        them, and every record is out)."""
        while (self.unadmitted > (0 if final else self.holding) and self.next < len(self.batches)) or (
                final and (self.flight or self.finishing)):
            if self._stopping():
                self.next, self.unadmitted = len(self.batches), 0  # no batch joins after a stop request
                if self.stop is not None and self.stop.immediate:
                    return  # what is in flight is dropped, unrecorded (it runs on the resume)
                if not final or (not self.flight and not self.finishing):
                    return
            failure: Failure | None = None
            with torch.inference_mode():
                try:
                    self._feed()
                    self._decode()
                except Exception as exc:  # the shared decode failed: recovered below, outside this handler
                    failure = Failure.of(exc)
                if failure is not None:
                    self._recover(failure)
                self._finish_ready()
            self.clock.mark(self._talker_state())
            yield from self._finished(wait=final and not self.flight and self.next >= len(self.batches))
            while sum(rows for _, rows in self.finishing) > self.backlog_rows:  # code2wav sets the pace
                yield from self._finished(wait=True)

    def _talker_state(self) -> TalkerState:
        return "idle_with_work" if self.session is not None and not self.session.idle else "waiting"

    def _has_work(self) -> bool:
        """Whether this thread has something to do besides waiting for the frontend."""
        return (self.session is not None and not self.session.idle) or any(not f.todo for f in self.flight)

    def _feed(self) -> None:
        """Admit prepared batches while a slot could take their segments without waiting a window."""
        assert self.frontend is not None
        while self.next < len(self.batches) and (self.session is None or self.session.waiting < self.slots):
            k = self.next
            if self._has_work() and not self.frontend.ready(k):
                return  # never wait while there is work: the batch joins once prepared
            rows = self.batches[k]
            self._admitted(k)
            try:
                prepared = self.frontend.take(k) or self._prepare_timed(rows)
            except Exception as exc:  # outside the per-row guards: each row alone
                self.flight.append(_InFlight(rows=rows, prepared=None, error=Failure.of(exc)))
                continue
            f = _InFlight(rows=rows, prepared=prepared)
            segs = prepared.segments
            alive = [i for i, (rid, _) in enumerate(segs) if prepared.outcomes[rid].status == "ok"]
            f.results, todo = I.stored_results(self.tokens, segs, alive)
            self.flight.append(f)
            if todo:
                try:
                    reqs = [self.ops.request(segs[i][1]) for i in todo]
                # a malformed segment: the batch goes row by row (the row fails alone)
                except Exception as exc:
                    f.prepared, f.error = None, Failure.of(exc)
                    continue
                session = self._session(len(todo))
                tickets = session.add(reqs)
                f.todo.update(todo)
                self.owner.update({t: (f, i) for t, i in zip(tickets, todo, strict=True)})
                self.clock.mark("idle_with_work")

    def _session(self, first: int) -> TalkerSessionLike:
        """The open session, or a new one (``first``: segments the first batch brings)."""
        if self.session is None:
            if not self.opts.talker_slots:
                self.slots = max(self.slots, first)
            self.session = self.ops.session(self.slots)
        return self.session

    def _decode(self) -> None:
        """One decode window; finished segments land in their batches (and the stage-0 checkpoint)."""
        if self.session is None or self.session.idle:
            return
        self.clock.mark("busy")
        done = self.session.poll()
        self.clock.mark(self._talker_state())
        for t, res in done:
            f, i = self.owner.pop(t)
            self._land(f, i, res)

    def _land(self, f: _InFlight, i: int, res: TalkerResult) -> None:
        assert f.prepared is not None  # a batch with segments in the talker was prepared
        seg = f.prepared.segments[i]
        f.results[i] = res
        f.todo.discard(i)
        I.store_result(self.tokens, seg, res)
        f.prepared.outcomes[seg[0]].took("talker", float(getattr(res, "seconds", 0.0)))

    def _recover(self, failure: Failure) -> None:
        """After the handler: close the failed session, free the device's cache, and decode what it
        held batch by batch with the isolation's confinement."""
        log.warning("talker session failed (%s); its rows are decoded batch by batch", failure.describe())
        self._close_session()
        self.owner.clear()
        if failure.oom:  # idle pooled steps go; empty_cache unless a capture failed
            free_device_cache(self.stages.policy.device)
        for f in self.flight:
            if not f.todo:
                continue
            assert f.prepared is not None
            rest = sorted(f.todo)
            segs = f.prepared.segments
            self.clock.mark("busy")
            fresh = self.ops.retry([segs[i] for i in rest], f.prepared.outcomes)
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

    # -- code2wav ----------------------------------------------------------------------------------------

    def _finish_ready(self) -> None:
        """Batches with nothing left in the talker go to code2wav: in batch order, or (not ``ordered``)
        each as soon as its own segments are out, whatever batches before it still decode."""
        while True:
            k = next((k for k, f in enumerate(self.flight) if not f.todo), None)
            if k is None or (self.ordered and k > 0):
                return
            f = self.flight.pop(k)
            if self.code2wav is None:
                done: Future[list[RowResult]] = Future()
                done.set_result(self._finish(f))
            else:
                done = self.code2wav.submit(self._finish_on_stream, f)
            self.finishing.append((done, len(f.rows)))

    def _finish(self, f: _InFlight) -> list[RowResult]:
        t0 = self.clock.clock()
        try:
            if f.prepared is None:
                assert f.error is not None
                return self.ops.rows_alone(f.rows, f.error)
            failure: Failure | None = None
            try:
                return self.ops.finish(f.prepared, f.results)
            # each row alone, after this handler (its frames hold the batch's tensors)
            except Exception as exc:
                failure = Failure.of(exc)
            return self.ops.rows_alone(f.rows, failure)
        finally:
            self.clock.add("code2wav", self.clock.clock() - t0)

    def _finish_on_stream(self, f: _InFlight) -> list[RowResult]:
        """code2wav on its own CUDA stream (its kernels overlap the talker's), after what was queued
        before."""
        if self.stream is None:
            return self._finish(f)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            records = self._finish(f)
        self.stream.synchronize()
        return records

    def _finished(self, *, wait: bool) -> Iterator[RowResult]:
        """Finished batches' records in batch order (``wait``: the next one at least)."""
        while self.finishing and (wait or self.finishing[0][0].done()):
            yield from self.finishing.pop(0)[0].result()
            wait = False
