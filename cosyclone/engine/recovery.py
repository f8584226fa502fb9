"""What a failed talker session held, decoded again batch by batch with failures confined.

Why apart: recovery runs after the ``except`` block that caught the session's failure has ended (a
traceback keeps the failed frames' tensors alive), once the session is closed and the device's cache
freed (:meth:`.talker_flight.TalkerFlight.recover`); what it decodes goes the isolated way
(:func:`.isolation.generate_isolated` through :meth:`.stage_ops.StageOps.retry`: out of memory halves
down to the rows that cannot fit, anything else retries segment by segment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cosyclone.engine.clock import StageClock
from cosyclone.engine.in_flight import InFlight
from cosyclone.engine.stage_ops import StageOps

if TYPE_CHECKING:
    from cosyclone.talker.results import TalkerResult


def decode_held(batches: Sequence[InFlight], ops: StageOps, clock: StageClock,
                land: Callable[[InFlight, int, TalkerResult], None]) -> None:
    """Every segment still in the talker, batch by batch; each result handed to ``land``."""
    for f in batches:
        if not f.todo:
            continue
        assert f.prepared is not None
        rest = sorted(f.todo)
        segs = f.prepared.segments
        clock.mark("busy")
        fresh = ops.retry([segs[i] for i in rest], f.prepared.outcomes)
        f.todo.clear()
        for j, res in fresh.items():
            land(f, rest[j], res)
