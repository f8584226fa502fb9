"""Where a run's time went: each stage's busy and waiting seconds, and the talker's idle-with-work.

Why: a pipeline is as fast as its slowest stage, and a GPU that waits while it holds work is the
costliest waste there is. The scheduler marks the talker's state as it changes (decoding; rows in
its slots but not stepping, ``idle_with_work``; nothing to decode, ``waiting``) and each interval
goes to the state it was in; the frontend's and code2wav's workers add the seconds each batch took
them. :meth:`StageClock.seconds` turns that into :class:`~cosyclone.engine.facts.StageSeconds`,
whose ``bound_by`` names the stage that set the run's pace (the device, when the talker and code2wav
share one: their busy seconds add up there). The clock is injectable (stand-in
stages may run on a simulated one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from cosyclone.engine.facts import StageSeconds, StageTime

#: The talker's states between two marks.
TalkerState = Literal["busy", "idle_with_work", "waiting"]


class StageClock:
    """Accumulates the stages' seconds as the run goes (thread-safe: the workers add theirs)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, *, frontend_workers: int = 1,
                 shared_device: bool = True) -> None:
        self.clock = clock
        self.frontend_workers = max(1, frontend_workers)  # prompt workers: the frontend's parallel width
        self.shared_device = shared_device  # talker and code2wav on one device (their seconds add up)
        self.t0: float | None = None
        self.last = 0.0
        self.state: TalkerState = "waiting"
        self.talker = {"busy": 0.0, "idle_with_work": 0.0, "waiting": 0.0}
        self.frontend_busy = 0.0  # the batch thread's seconds (it waits for prompt workers inside)
        self.prompt_busy = 0.0  # prompt workers' seconds, all workers together
        self.code2wav_busy = 0.0
        self._lock = threading.Lock()

    def start(self) -> None:
        """The run's first work (the time before it is not the run's)."""
        if self.t0 is None:
            self.t0 = self.last = self.clock()

    def mark(self, state: TalkerState) -> None:
        """The talker is in ``state`` from now on; the interval since the last mark goes to the old state."""
        if self.t0 is None:
            self.start()
        now = self.clock()
        self.talker[self.state] += now - self.last
        self.last, self.state = now, state

    def add(self, stage: Literal["frontend", "prompts", "code2wav"], seconds: float) -> None:
        """A worker's seconds on one batch (or one prompt)."""
        with self._lock:
            if stage == "frontend":
                self.frontend_busy += seconds
            elif stage == "prompts":
                self.prompt_busy += seconds
            else:
                self.code2wav_busy += seconds

    def timed(self, stage: Literal["frontend", "prompts", "code2wav"], fn: Callable[[], object]) -> object:
        t0 = self.clock()
        try:
            return fn()
        finally:
            self.add(stage, self.clock() - t0)

    def seconds(self) -> StageSeconds:
        """The figures so far (the current interval counted to its state)."""
        if self.t0 is None:
            return StageSeconds.empty()
        self.mark(self.state)
        wall = self.last - self.t0
        t = self.talker
        front = max(self.frontend_busy, self.prompt_busy / self.frontend_workers)
        return StageSeconds(
            wall=wall,
            frontend=StageTime(busy=front, waiting=max(0.0, wall - front)),
            talker=StageTime(busy=t["busy"], waiting=t["waiting"]),
            code2wav=StageTime(busy=self.code2wav_busy, waiting=max(0.0, wall - self.code2wav_busy)),
            talker_idle_with_work=t["idle_with_work"], shared_device=self.shared_device)
