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

This class decides which batch goes where and when; what is in the talker (the session, the one
registry from a ticket to its segment) is :class:`~.talker_flight.TalkerFlight`'s, the recovery of a
failed session :mod:`.recovery`'s, and code2wav (its thread, stream and backlog)
:class:`~.code2wav_worker.Code2wavWorker`'s.

Must not: plan batches or run a stage itself (:mod:`.batches`, :mod:`.stage_ops`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from cosyclone.base.stop import StopRequest
from cosyclone.engine import isolation
from cosyclone.engine import stages as stage_calls
from cosyclone.engine.batch_window import BatchWindow
from cosyclone.engine.clock import StageClock
from cosyclone.engine.code2wav_worker import Code2wavWorker
from cosyclone.engine.in_flight import InFlight
from cosyclone.engine.outcome import Failure, RowResult
from cosyclone.engine.prefetch import FrontendPrefetch, PromptAhead
from cosyclone.engine.stage_ops import RealOps, StageOps
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.engine.talker_flight import TalkerFlight
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions
from cosyclone.talker.graph_pool import PROCESS

__all__ = ["FrontendPrefetch", "StageSchedule"]


class StageSchedule:
    """One run's pipeline (see the module docstring); :meth:`feed` and :meth:`drain` yield the records."""

    def __init__(
        self,
        stages: Stages,
        opts: RunOptions,
        *,
        tokens: isolation.TokenCheckpoint | None = None,
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
        self.dec = stage_calls.decode_options(stages.cfg, opts, sizing)  # on a GPU: the sizing rule's caps
        self.ops: StageOps = ops if ops is not None else RealOps(stages, opts, self.dec, tokens)
        workers = sizing.frontend_workers if sizing is not None else 1
        self.clock = clock if clock is not None else StageClock(frontend_workers=workers,
                                                                 shared_device=self.ops.shared_device)
        self.ordered = ordered
        # the batches fed and not yet admitted, by run index (the admitted ones are forgotten)
        self.batches = BatchWindow()
        self.unadmitted = 0  # rows of the fed batches not yet admitted
        device = stages.policy.device
        # the talker's side: the batches in it, their segments by ticket, the session (slots set at the first
        # feed)
        self.talker = TalkerFlight(self.ops, tokens, self.clock, device, self.graph_errors,
                                   fixed_slots=bool(opts.talker_slots))
        self.next = 0  # next batch to admit
        self.frontend: FrontendPrefetch | None = None
        self.prompt_workers: PromptAhead | None = None
        self._pool: ThreadPoolExecutor | None = None
        threaded = opts.code2wav_thread if opts.code2wav_thread is not None else device.type == "cuda"
        self.code2wav = Code2wavWorker(self.ops, self.clock, device, threaded=threaded)

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
        self.talker.close()
        self.code2wav.close()
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
        self.talker.slots = max(1, opts.talker_slots or min(per_batch, self.batches.rows_from(0)))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-frontend")
        frontend = self.stages.frontend
        if self.prefetch and sizing is not None and PromptAhead.usable(frontend):
            ahead_rows = max(2 * self.talker.slots, 4 * sizing.frontend_workers)
            self.prompt_workers = PromptAhead(frontend, self.batches, workers=sizing.frontend_workers,
                                              threads=sizing.frontend_threads, ahead_rows=ahead_rows,
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
        self.backlog_rows = max(4 * self.talker.slots, 2 * per_batch, 64)
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
                    records = isolation.synthesize_batch(self.ops, self.stages, batch, self.opts, self.tokens,
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
                final and (self.talker.batches or self.code2wav.pending)):
            if self._stopping():
                self.next, self.unadmitted = len(self.batches), 0  # no batch joins after a stop request
                if self.stop is not None and self.stop.immediate:
                    return  # what is in flight is dropped, unrecorded (it runs on the resume)
                if not final or (not self.talker.batches and not self.code2wav.pending):
                    return
            failure: Failure | None = None
            with torch.inference_mode():
                try:
                    self._admit()
                    self.talker.decode()
                except Exception as exc:  # the shared decode failed: recovered below, outside this handler
                    failure = Failure.of(exc)
                if failure is not None:
                    self.talker.recover(failure)
                self._finish_ready()
            self.clock.mark(self.talker.state())
            last = final and not self.talker.batches and self.next >= len(self.batches)
            yield from self.code2wav.finished(wait=last)
            while self.code2wav.backlog > self.backlog_rows:  # code2wav sets the pace
                yield from self.code2wav.finished(wait=True)

    def _admit(self) -> None:
        """Admit prepared batches while a slot could take their segments without waiting a window."""
        assert self.frontend is not None
        while self.next < len(self.batches) and self.talker.room:
            k = self.next
            if self.talker.has_work() and not self.frontend.ready(k):
                return  # never wait while there is work: the batch joins once prepared
            rows = self.batches[k]
            self._admitted(k)
            try:
                prepared = self.frontend.take(k) or self._prepare_timed(rows)
            except Exception as exc:  # outside the per-row guards: each row alone
                self.talker.join(InFlight(rows=rows, prepared=None, error=Failure.of(exc)))
                continue
            self.talker.join(InFlight(rows=rows, prepared=prepared))

    # -- code2wav ----------------------------------------------------------------------------------------

    def _finish_ready(self) -> None:
        """Batches with nothing left in the talker go to code2wav: in batch order, or (not ``ordered``)
        each as soon as its own segments are out, whatever batches before it still decode."""
        while (f := self.talker.pop_ready(ordered=self.ordered)) is not None:
            self.code2wav.submit(f)
