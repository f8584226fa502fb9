"""How full the decode steps were: live rows per step and the slot buckets the steps ran over.

Why: a step costs what the slots it computes cost (:meth:`~cosyclone.talker.step.SlotStep.bucket_view`),
so a night's decode time follows its live rows only as far as the buckets do; the run record
carries the mean live slots per step and the steps per bucket so a GPU night can be read against
a step's measured cost at that occupancy. Every talker session in the process adds to
:data:`PROCESS_OCCUPANCY` (static, continuous and isolation retries alike); a run takes a
:meth:`~Occupancy.figures` snapshot when it starts and reports the difference.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OccupancyFigures:
    """Decode steps, their live rows and their buckets (a snapshot, or the difference of two)."""

    steps: int = 0  # decode steps run
    live_slot_steps: int = 0  # running rows summed over those steps
    buckets: dict[int, int] = field(default_factory=dict)  # slots a step computed -> steps run so
    moves: int = 0  # rows moved to a lower slot so that a smaller bucket held them

    @property
    def mean_live_slots(self) -> float | None:
        """Running rows per decode step (None before any step)."""
        return self.live_slot_steps / self.steps if self.steps else None

    def since(self, earlier: OccupancyFigures) -> OccupancyFigures:
        """What happened after ``earlier`` was taken."""
        buckets = {b: n - earlier.buckets.get(b, 0) for b, n in self.buckets.items()}
        return OccupancyFigures(steps=self.steps - earlier.steps,
                                live_slot_steps=self.live_slot_steps - earlier.live_slot_steps,
                                buckets={b: n for b, n in sorted(buckets.items()) if n},
                                moves=self.moves - earlier.moves)

    def as_record(self) -> dict[str, Any]:
        """``mean_live_slots`` and ``decode_buckets`` (bucket as a string -> steps), as a run records them."""
        mean = self.mean_live_slots
        return {"mean_live_slots": None if mean is None else round(mean, 3),
                "decode_buckets": {str(b): n for b, n in sorted(self.buckets.items())},
                "decode_steps": self.steps, "slot_moves": self.moves}


class Occupancy:
    """The process's running tally (thread-safe: Ray actors and tests may decode from threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps = 0
        self._live = 0
        self._moves = 0
        self._buckets: Counter[int] = Counter()

    def add(self, *, steps: int, live: int, bucket: int) -> None:
        """``steps`` decode steps over ``bucket`` slots with ``live`` rows running."""
        with self._lock:
            self._steps += steps
            self._live += steps * live
            self._buckets[bucket] += steps

    def moved(self, n: int) -> None:
        with self._lock:
            self._moves += n

    def figures(self) -> OccupancyFigures:
        with self._lock:
            return OccupancyFigures(steps=self._steps, live_slot_steps=self._live,
                                    buckets=dict(self._buckets), moves=self._moves)


#: This process's tally.
PROCESS_OCCUPANCY = Occupancy()
