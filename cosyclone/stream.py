"""The continuous schedule: one talker session across a run's batches (``--schedule continuous``).

Owns the interleaving only: which planned batch's segments join the open
:class:`~cosyclone.talker.decode.TalkerSession`, when a batch has left the talker and goes to
code2wav (on this thread, or a worker thread with its own CUDA stream), and in which order the
finished batches' records are emitted. Must not: plan batches, prepare rows or run a stage itself;
those are :mod:`cosyclone.pipeline`'s, called here through the module (``P.prepare_batch``, ...)
so that the static and the continuous schedule run exactly the same stage calls. The two
schedules give the same tokens and the same code2wav batches, hence the same WAV bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from . import pipeline as P
from .manifest import ManifestRow
from .pipeline import FrontendPrefetch, PreparedBatch, RunOptions, Stages
from .writer import RowRecord

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    """A batch whose segments are (partly) in the talker."""

    rows: list[ManifestRow]
    prepared: PreparedBatch | None  # None when its frontend raised outside the per-row guards (``error``)
    results: dict[int, Any] = field(default_factory=dict)  # segment index -> talker result
    todo: set[int] = field(default_factory=set)  # segment indices still in the talker
    error: BaseException | None = None  # why the batch goes through every stage row by row instead


class ContinuousStream:
    """The continuous schedule: one :class:`~cosyclone.talker.decode.TalkerSession` across batches.

    Each turn: while fewer segments wait for a slot than there are slots, the next batch's segments
    join the session (stage-0 checkpoint hits and rows that failed in the frontend skip it); one
    decode window runs; every batch with no segment left in the talker goes to code2wav and its
    records to the writer, in batch order. If the shared session raises (out of memory, a bug),
    the segments it still held go the static way (:func:`~cosyclone.pipeline.talker_with_checkpoint`: halving on out
    of memory, isolation per segment) and the next batches start a fresh session.

    code2wav of a finished batch runs on this thread between decode windows (CPU: the two share
    the cores), or with ``code2wav_thread`` on a worker thread with its own CUDA stream, so the
    talker goes on meanwhile; records are emitted here either way, in batch order.
    """

    def __init__(self, stages: Stages, batches: Sequence[Sequence[ManifestRow]], opts: RunOptions,
                 frontend: FrontendPrefetch, emit: Callable[[Sequence[RowRecord]], None]) -> None:
        self.stages, self.batches, self.opts, self.frontend, self.emit = stages, batches, opts, frontend, emit
        self.dec = P.decode_options(stages.cfg, opts)
        # slots: --talker-slots, else a batch's worth (no more than the run's rows: an empty slot
        # computes too) or, when the first batch to decode brings more segments, that many
        self.slots = max(1, opts.talker_slots or min(opts.batch_size, sum(len(b) for b in batches)))
        self.session: Any = None
        self.owner: dict[int, tuple[_InFlight, int]] = {}  # ticket -> (batch, segment index)
        self.flight: list[_InFlight] = []
        self.next = 0  # next batch to feed
        threaded = opts.code2wav_thread
        if threaded is None:
            threaded = stages.policy.device.type == "cuda"
        self.finishing: list[Future[list[RowRecord]]] = []
        self.code2wav = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cosyclone-code2wav") if threaded else None
        device = stages.policy.device
        self.stream = torch.cuda.Stream(device) if threaded and device.type == "cuda" else None  # code2wav's own

    @torch.inference_mode()
    def run(self) -> None:
        try:
            while self.next < len(self.batches) or self.flight or self.finishing:
                try:
                    self._feed()
                    self._decode()
                except Exception as exc:  # the shared decode failed: what it held goes the per-batch way
                    self._recover(exc)
                self._finish_ready()
                self._emit_finished(wait=not self.flight and self.next >= len(self.batches))
        finally:
            self._close_session()
            if self.code2wav is not None:
                self.code2wav.shutdown(wait=True)

    def _feed(self) -> None:
        """Add batches while a slot could take their segments without waiting a window."""
        while self.next < len(self.batches) and (self.session is None or self.session.waiting < self.slots):
            k = self.next
            self.next += 1
            try:
                prepared = self.frontend.take(k) or P.prepare_batch(self.stages, self.batches[k], self.opts)
            except Exception as exc:  # outside the per-row guards: each row alone, as synthesize_batch_isolated
                self.flight.append(_InFlight(rows=list(self.batches[k]), prepared=None, error=exc))
                continue
            f = _InFlight(rows=list(self.batches[k]), prepared=prepared)
            segs = prepared.segments
            alive = [i for i, (rid, _) in enumerate(segs) if prepared.outcomes[rid].status == "ok"]
            f.results, todo = P.stored_results(self.stages, segs, alive)
            self.flight.append(f)
            if todo:
                from .conditioning import to_talker_request

                try:
                    reqs = [to_talker_request(segs[i][1]) for i in todo]
                except Exception as exc:  # a malformed segment: the batch goes row by row (the row fails alone)
                    f.prepared, f.error = None, exc
                    continue
                session = self._session(len(todo))
                tickets = session.add(reqs)
                f.todo.update(todo)
                self.owner.update({t: (f, i) for t, i in zip(tickets, todo, strict=True)})

    def _session(self, first: int) -> Any:
        """The open session, or a new one (``first``: segments the first batch brings)."""
        if self.session is None:
            from .talker import decode

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

    def _land(self, f: _InFlight, i: int, res: Any) -> None:
        assert f.prepared is not None  # a batch with segments in the talker was prepared
        seg = f.prepared.segments[i]
        f.results[i] = res
        f.todo.discard(i)
        P.store_result(self.stages, seg, res)
        seconds = f.prepared.outcomes[seg[0]].seconds
        seconds["talker"] = seconds.get("talker", 0.0) + float(getattr(res, "seconds", 0.0))

    def _recover(self, exc: BaseException) -> None:
        """Decode what the failed session held batch by batch, with the static path's isolation."""
        log.warning("talker session failed (%s: %s); its rows are decoded batch by batch", type(exc).__name__, exc)
        self._close_session()
        self.owner.clear()
        if P.is_out_of_memory(exc) and self.stages.policy.device.type == "cuda":
            torch.cuda.empty_cache()
        for f in self.flight:
            if not f.todo:
                continue
            assert f.prepared is not None
            rest = sorted(f.todo)
            segs = f.prepared.segments
            fresh = P.generate_isolated(self.stages, [segs[i] for i in rest], self.dec, f.prepared.outcomes)
            f.todo.clear()
            for j, res in fresh.items():
                self._land(f, rest[j], res)

    def _close_session(self) -> None:
        session, self.session = self.session, None
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
                done: Future[list[RowRecord]] = Future()
                done.set_result(self._finish(f))
            else:
                done = self.code2wav.submit(self._finish_on_stream, f)
            self.finishing.append(done)

    def _finish(self, f: _InFlight) -> list[RowRecord]:
        if f.prepared is None:
            assert f.error is not None
            return P.rows_alone(self.stages, f.rows, self.opts, f.error)
        try:
            return P.finish_batch(self.stages, f.prepared, f.results, self.opts)
        except Exception as exc:
            return P.rows_alone(self.stages, f.rows, self.opts, exc)

    def _finish_on_stream(self, f: _InFlight) -> list[RowRecord]:
        """code2wav on its own CUDA stream (its kernels overlap the talker's), after what was queued before."""
        if self.stream is None:
            return self._finish(f)
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            records = self._finish(f)
        self.stream.synchronize()
        return records

    def _emit_finished(self, *, wait: bool) -> None:
        """Hand finished batches' records to the writer in batch order (``wait``: the next one at least)."""
        while self.finishing and (wait or self.finishing[0].done()):
            self.emit(self.finishing.pop(0).result())
            wait = False
