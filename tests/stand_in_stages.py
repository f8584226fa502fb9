"""Stand-in stages for driving the real pipeline (:class:`cosyclone.engine.schedule.StageSchedule`)
without a model: injected through ``Engine.pipeline(ops=...)``, each stage's cost set by the test.

A stand-in row needs ``steps`` decode windows (one per :meth:`FakeSession.poll`); the frontend
sleeps ``frontend_s`` per row (and ``prompt_s`` per prompt on the prompt workers), a window
sleeps ``window_s``, code2wav sleeps ``code2wav_s`` per row. ``hooks`` lets a test act at a
stage's call (block the frontend, count the windows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from typing_extensions import override

from cosyclone.base.device import resolve
from cosyclone.engine import Engine, RowResult
from cosyclone.engine.clock import StageClock
from cosyclone.engine.outcome import Failure, RowOutcome
from cosyclone.engine.prefetch import PromptAhead
from cosyclone.engine.schedule import StageSchedule
from cosyclone.engine.stages import PreparedBatch, Stages
from cosyclone.manifest import ManifestRow
from cosyclone.model.config import released_config
from cosyclone.options import RunOptions


@dataclass
class Costs:
    """Seconds each stage spends (wall, by sleeping)."""

    frontend_s: float = 0.0  # per row, on the frontend thread
    prompt_s: float = 0.0  # per distinct prompt, on a prompt worker
    window_s: float = 0.0  # per decode window (all slots together)
    code2wav_s: float = 0.0  # per row
    steps: int = 3  # decode windows a row needs
    prompt_cache: bool = False  # a prompt costs prompt_s once (as the real frontend's prompt cache)


@dataclass
class Segment:
    """What the stand-in talker gets for a row."""

    row_id: str
    steps: int
    segment: int = 0  # the segment's index in its row (the stage-0 checkpoint's key)


class StandInFrontend:
    """Prompt features on the prompt workers: notes the thread that computed each."""

    def __init__(self, costs: Costs) -> None:
        self.costs = costs
        self.threads: list[threading.Thread] = []
        self.seen: set[str] = set()  # prompts computed once

    def prompt_features(self, audio: Any, *, row_id: str | None = None) -> dict[str, torch.Tensor]:
        self.threads.append(threading.current_thread())
        if not (self.costs.prompt_cache and str(audio) in self.seen):
            time.sleep(self.costs.prompt_s)
        self.seen.add(str(audio))
        return {"speech_token": torch.zeros(1)}


class FakeSession:
    """A talker session whose rows each need ``steps`` windows; ``slots`` rows decode at once."""

    def __init__(self, slots: int, costs: Costs, on_poll: Callable[[FakeSession], None] | None) -> None:
        self.slots, self.costs, self.on_poll = slots, costs, on_poll
        self.queue: list[tuple[int, Segment]] = []
        self.running: dict[int, list[Any]] = {}  # ticket -> [segment, windows left]
        self.n = 0
        self.polls = 0

    def add(self, requests: Sequence[Any]) -> list[int]:
        tickets = list(range(self.n, self.n + len(requests)))
        self.n += len(requests)
        self.queue.extend(zip(tickets, requests, strict=True))
        return tickets

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def idle(self) -> bool:
        return not self.queue and not self.running

    def poll(self) -> list[tuple[int, Any]]:
        while self.queue and len(self.running) < self.slots:
            t, seg = self.queue.pop(0)
            self.running[t] = [seg, seg.steps]
        self.polls += 1
        if self.on_poll is not None:
            self.on_poll(self)
        time.sleep(self.costs.window_s)
        done = []
        for t in list(self.running):
            self.running[t][1] -= 1
            if self.running[t][1] <= 0:
                seg = self.running.pop(t)[0]
                done.append((t, _Result(seg.row_id)))
        return done

    def close(self) -> None:
        self.queue.clear()
        self.running.clear()


@dataclass
class _Result:
    row_id: str
    tokens: list[int] = field(default_factory=lambda: [1, 2, 3])
    stop_reason: str = "eos"
    diagnostics: Any = None
    seconds: float = 0.0


class StandInOps:
    """The pipeline's stage calls (:class:`cosyclone.engine.stage_ops.StageOps`) at set costs."""

    def __init__(self, costs: Costs, *, on_prepare: Callable[[Sequence[ManifestRow]], None] | None = None,
                 on_poll: Callable[[FakeSession], None] | None = None, shared_device: bool = False) -> None:
        self.costs, self.on_prepare, self.on_poll = costs, on_prepare, on_poll
        # stand-in stages only sleep, side by side: two devices unless a test says they share one
        self.shared_device = shared_device
        self.sessions: list[FakeSession] = []

    def prepare(self, rows: Sequence[ManifestRow], prompts: PromptAhead | None) -> PreparedBatch:
        if self.on_prepare is not None:
            self.on_prepare(rows)
        outcomes = {r.id: RowOutcome(row_id=r.id, line=r.line, seed=0) for r in rows}
        for row in rows:
            if prompts is not None:
                prompts.take(row)
            time.sleep(self.costs.frontend_s)
        segs: list[tuple[str, Any]] = [(r.id, Segment(r.id, self.costs.steps)) for r in rows]
        return PreparedBatch(rows=list(rows), outcomes=outcomes, segments=segs)

    def request(self, segment: Any) -> Any:
        return segment

    def session(self, slots: int) -> FakeSession:
        self.sessions.append(FakeSession(slots, self.costs, self.on_poll))
        return self.sessions[-1]

    def talk(self, requests: Sequence[Any], dec: Any) -> list[Any]:
        raise AssertionError("the stand-in talker decodes in its session only")

    def retry(self, segments: Sequence[tuple[str, Any]], outcomes: dict[str, RowOutcome]) -> dict[int, Any]:
        raise AssertionError("the stand-in talker never fails")

    def finish(self, prepared: PreparedBatch, results: dict[int, Any]) -> list[RowResult]:
        out = []
        for row in prepared.rows:
            time.sleep(self.costs.code2wav_s)
            out.append(prepared.outcomes[row.id].result(np.zeros(10, np.float32), 24000))
        return out

    def rows_alone(self, rows: Sequence[ManifestRow], exc: Failure) -> list[RowResult]:
        raise AssertionError(f"the stand-in stages never raise: {exc!r}")


def stand_in_engine(costs: Costs, **opts: Any) -> Engine:
    """An engine over no model: a stand-in frontend (prompt features only), CPU sizing from ``opts``."""
    stages = Stages(released_config(), resolve("cpu", "fp32"), StandInFrontend(costs), None, None, None)  # type: ignore[arg-type]
    return Engine(stages, RunOptions(device="cpu", dtype="fp32", cpu_gemm="aten", cuda_graphs="off", **opts))


class StandInRunEngine(Engine):
    """An engine over no model whose every pipeline runs the stand-in stages: what a whole run (a
    :class:`~cosyclone.run.job.SynthJob` given it as its loaded engine) drives from manifest to folder.
    ``clock``: the last pipeline's stage accounting; ``ops``: its stand-in calls."""

    def __init__(self, costs: Costs, opts: RunOptions,
                 on_poll: Callable[[FakeSession], None] | None = None) -> None:
        frontend: Any = StandInFrontend(costs)
        stages = Stages(released_config(), resolve("cpu", "fp32"), frontend, None, None, None)  # type: ignore[arg-type]
        super().__init__(stages, opts)
        self.costs, self.on_poll = costs, on_poll
        self.clock: StageClock | None = None
        self.ops: StandInOps | None = None

    @override
    def pipeline(self, **kw: Any) -> StageSchedule:
        kw.pop("ops", None)
        kw.pop("clock", None)
        self.clock = StageClock(frontend_workers=self.sizing.frontend_workers)
        self.ops = StandInOps(self.costs, on_poll=self.on_poll)
        return super().pipeline(ops=self.ops, clock=self.clock, **kw)


def rows(
    n: int, *, prompt: Callable[[int], str] = lambda i: f"p{i}.wav", start: int = 0
) -> list[ManifestRow]:
    return [ManifestRow(line=i + 1, id=f"r{i}", prompt_audio=Path(prompt(i)), prompt_text="", text="x")
            for i in range(start, start + n)]
