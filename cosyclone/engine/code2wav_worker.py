"""code2wav for the pipeline: batches whose segments all left the talker, turned into records.

Why apart from the schedule: where code2wav runs (this thread, or a worker thread with its own CUDA
stream so its kernels overlap the talker's) and the backlog it keeps are one concern; the schedule only
hands it batches and takes their records back, in the order it handed them. A batch that raises
outside the stages' own guards goes through every stage row by row, after the handler (its frames hold
the batch's tensors).

Must not: decide which batch is ready (:mod:`.schedule`) or run a stage itself (:mod:`.stage_ops`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from cosyclone.base.streams import code2wav_stream
from cosyclone.engine.clock import StageClock
from cosyclone.engine.in_flight import InFlight
from cosyclone.engine.outcome import Failure, RowResult
from cosyclone.engine.stage_ops import StageOps


class Code2wavWorker:
    """code2wav over handed batches, on this thread or one worker thread; records in hand-over order."""

    def __init__(self, ops: StageOps, clock: StageClock, device: torch.device, *, threaded: bool) -> None:
        self.ops, self.clock = ops, clock
        # the worker takes this thread's torch threads (--threads): a new thread would start at torch's
        # default
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-code2wav",
                                       initializer=torch.set_num_threads,
                                       initargs=(torch.get_num_threads(),)) if threaded else None
        self.stream = code2wav_stream(device) if threaded and device.type == "cuda" else None  # the process's
        self.pending: list[tuple[Future[list[RowResult]], int]] = []  # the backlog: (records, rows), in order

    @property
    def backlog(self) -> int:
        """Rows handed over whose records are not taken yet."""
        return sum(rows for _, rows in self.pending)

    def submit(self, f: InFlight) -> None:
        """Hand over a batch with nothing left in the talker."""
        if self.pool is None:
            done: Future[list[RowResult]] = Future()
            done.set_result(self._finish(f))
        else:
            done = self.pool.submit(self._on_stream, f)
        self.pending.append((done, len(f.rows)))

    def finished(self, *, wait: bool) -> Iterator[RowResult]:
        """The finished batches' records in hand-over order (``wait``: the next one at least)."""
        while self.pending and (wait or self.pending[0][0].done()):
            yield from self.pending.pop(0)[0].result()
            wait = False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def _finish(self, f: InFlight) -> list[RowResult]:
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

    def _on_stream(self, f: InFlight) -> list[RowResult]:
        """code2wav on its own CUDA stream (its kernels overlap the talker's), after what was queued
        before."""
        if self.stream is None:
            return self._finish(f)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            records = self._finish(f)
        self.stream.synchronize()
        return records
