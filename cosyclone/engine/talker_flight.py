"""The talker side of the continuous schedule: the batches in the talker, one session over the run, and
the one registry from a session ticket to the segment it decodes.

Why apart from the schedule: the schedule decides which prepared batch joins and when; this holds what
is in the talker and lands each result where it belongs (its batch, the stage-0 checkpoint, the row's
talker seconds). If the session raises, :meth:`TalkerFlight.recover` runs after the ``except`` block has
ended (a traceback keeps the failed frames' tensors alive): the session is closed, the device's cache
freed, and what it held is decoded the isolated way (:func:`.recovery.decode_held`).

Must not: choose batches or run code2wav (:mod:`.schedule`, :mod:`.code2wav_worker`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from cosyclone.engine import isolation
from cosyclone.engine.clock import StageClock, TalkerState
from cosyclone.engine.in_flight import InFlight
from cosyclone.engine.outcome import Failure
from cosyclone.engine.recovery import decode_held
from cosyclone.engine.stage_ops import StageOps, TalkerSessionLike
from cosyclone.talker.graph_pool import free_device_cache

if TYPE_CHECKING:
    from cosyclone.talker.results import TalkerResult

log = logging.getLogger(__name__)


class TalkerFlight:
    """The batches in the talker, their segments by ticket, and the session that decodes them."""

    def __init__(self, ops: StageOps, tokens: isolation.TokenCheckpoint | None, clock: StageClock,
                 device: torch.device, graph_errors: list[str], *, fixed_slots: bool) -> None:
        self.ops, self.tokens, self.clock, self.device = ops, tokens, clock, device
        self.graph_errors = graph_errors  # a session's failed graph capture is appended here
        self.slots = 0  # the session's slots (set at the run's first feed; grown by a first batch)
        self.fixed_slots = fixed_slots  # --talker-slots given: a first batch does not grow them
        self.session: TalkerSessionLike | None = None
        self.batches: list[InFlight] = []  # in the order they joined
        self.owner: dict[int, tuple[InFlight, int]] = {}  # ticket -> (batch, segment index)

    @property
    def room(self) -> bool:
        """Whether a slot could take another batch's segments without waiting a window."""
        return self.session is None or self.session.waiting < self.slots

    def has_work(self) -> bool:
        """Whether the talker decodes, or a batch waits for code2wav."""
        return (self.session is not None and not self.session.idle) or any(not f.todo for f in self.batches)

    def state(self) -> TalkerState:
        return "idle_with_work" if self.session is not None and not self.session.idle else "waiting"

    def join(self, f: InFlight) -> None:
        """A batch joins: the segments the stage-0 checkpoint holds land at once, the rest go to the
        session (a batch without ``prepared`` waits to go through every stage row by row)."""
        self.batches.append(f)
        if f.prepared is None:
            return
        segs = f.prepared.segments
        alive = [i for i, (rid, _) in enumerate(segs) if f.prepared.outcomes[rid].status == "ok"]
        f.results, todo = isolation.stored_results(self.tokens, segs, alive)
        if not todo:
            return
        try:
            requests = [self.ops.request(segs[i][1]) for i in todo]
        except Exception as exc:  # a malformed segment: the batch goes row by row (the row fails alone)
            f.prepared, f.error = None, Failure.of(exc)
            return
        tickets = self._session(len(todo)).add(requests)
        f.todo.update(todo)
        self.owner.update({t: (f, i) for t, i in zip(tickets, todo, strict=True)})
        self.clock.mark("idle_with_work")

    def decode(self) -> None:
        """One decode window; finished segments land in their batches."""
        if self.session is None or self.session.idle:
            return
        self.clock.mark("busy")
        done = self.session.poll()
        self.clock.mark(self.state())
        for t, res in done:
            f, i = self.owner.pop(t)
            self._land(f, i, res)

    def pop_ready(self, *, ordered: bool) -> InFlight | None:
        """The next batch with nothing left in the talker (``ordered``: only the first batch), taken out."""
        k = next((k for k, f in enumerate(self.batches) if not f.todo), None)
        if k is None or (ordered and k > 0):
            return None
        return self.batches.pop(k)

    def recover(self, failure: Failure) -> None:
        """After the handler: close the failed session, free the device's cache, and decode what it held
        batch by batch with the isolation's confinement."""
        log.warning("talker session failed (%s); its rows are decoded batch by batch", failure.describe())
        self.close()
        self.owner.clear()
        if failure.oom:  # idle pooled steps go; empty_cache unless a capture failed
            free_device_cache(self.device)
        decode_held(self.batches, self.ops, self.clock, self._land)

    def close(self) -> None:
        """Close the session (a failed graph capture is recorded); safe to call twice."""
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

    def _session(self, first: int) -> TalkerSessionLike:
        """The open session, or a new one (``first``: segments the first batch brings)."""
        if self.session is None:
            if not self.fixed_slots:
                self.slots = max(self.slots, first)
            self.session = self.ops.session(self.slots)
        return self.session

    def _land(self, f: InFlight, i: int, res: TalkerResult) -> None:
        assert f.prepared is not None  # a batch with segments in the talker was prepared
        seg = f.prepared.segments[i]
        f.results[i] = res
        f.todo.discard(i)
        isolation.store_result(self.tokens, seg, res)
        f.prepared.outcomes[seg[0]].took("talker", float(getattr(res, "seconds", 0.0)))
