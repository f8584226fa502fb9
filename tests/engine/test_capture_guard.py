"""Captures never meet a free: code2wav runs out of memory while a capture is pending, and the run
goes on with at most one row failed, the cache freed only once the capture is done.

The CUDA parts are stand-ins (a capture backend that records when it captures, the free observed
where it forgets idle pooled steps); the guard, the engine, code2wav's recovery and the threads
are the real ones, on the tiny model."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from typing_extensions import override

from cosyclone.base.capture_guard import CAPTURE_GUARD, CaptureGuard
from cosyclone.talker import graph_pool
from cosyclone.talker.graph_pool import PROCESS, free_device_cache
from cosyclone.talker.graphs import EagerCapture, GraphedStep
from tests.capture import captured_with


class Timeline:
    """Captures under way and frees, as they happen, from every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.capturing = 0
        self.captures = 0
        self.frees = 0
        self.frees_during_capture = 0
        self.free_started = threading.Event()

    def free(self) -> None:
        with self.lock:
            self.frees += 1
            self.frees_during_capture += self.capturing > 0
        self.free_started.set()


class SlowCapture(EagerCapture):
    """A capture that records when it runs; ``slow``: it gives a racing free time to show itself (it
    waits, bounded, for one)."""

    def __init__(self, timeline: Timeline, *, slow: bool = True) -> None:
        super().__init__()
        self.timeline, self.slow = timeline, slow

    @override
    def capture(self, thunk: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        t = self.timeline
        with t.lock:
            t.capturing += 1
        if self.slow:
            t.free_started.wait(timeout=2.0)  # unguarded, the free would land here
        try:
            return super().capture(thunk)
        finally:
            with t.lock:
                t.capturing -= 1
                t.captures += 1


def test_a_free_waits_for_a_capture_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = CaptureGuard()
    order: list[str] = []

    def free() -> None:
        with guard.device_work():
            order.append("free")

    with guard.capturing():
        t = threading.Thread(target=free)
        t.start()
        t.join(timeout=0.5)
        order.append("capture done")
    t.join()
    assert order == ["capture done", "free"]
    with guard.device_work(), pytest.raises(RuntimeError, match="inside device work"), guard.capturing():
        pass

    def broken() -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(PROCESS, "drop_idle", broken)
    assert free_device_cache("cpu") is False  # logged, not raised: it runs inside recovery paths


class _Flow:
    """A loaded flow whose ``inference`` is ``inference``; anything else is the flow's own."""

    def __init__(self, flow: Any, inference: Any) -> None:
        self.flow, self.inference = flow, inference

    def __getattr__(self, name: str) -> Any:
        return getattr(self.flow, name)


def test_code2wav_oom_while_a_capture_is_pending_costs_at_most_one_row(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cosyclone.engine import Engine
    from cosyclone.manifest import rows_from_dicts
    from cosyclone.options import RunOptions
    from tests.frontend.test_prompt_cache import ROOT

    timeline = Timeline()
    real_drop = PROCESS.drop_idle

    def drop_idle() -> int:
        timeline.free()
        return real_drop()

    monkeypatch.setattr(PROCESS, "drop_idle", drop_idle)
    pending = threading.Event()
    real_capturing = CAPTURE_GUARD.capturing

    @contextlib.contextmanager
    def capturing() -> Iterator[None]:
        pending.set()  # a capture waits for the guard from here on
        with real_capturing():
            yield

    monkeypatch.setattr(CAPTURE_GUARD, "capturing", capturing)
    side: list[threading.Thread] = []
    injected: list[bool] = []

    engine = Engine.load(tiny_model_dir, RunOptions(device="cpu", max_tokens=6, n_timesteps=1, batch_size=2))
    flow = engine.stages.flow
    real_inference = flow.inference

    def inference(*args: Any, **kwargs: Any) -> Any:
        if injected:
            return real_inference(*args, **kwargs)
        # the first code2wav call: a decode step's capture becomes pending meanwhile (here from a
        # thread of its own, so that it surely overlaps this call), then this call runs out of memory
        step = GraphedStep(lambda key: None, backend=SlowCapture(timeline), warmup=1)
        side.append(threading.Thread(target=lambda: (step("step"), step("step"))))
        side[0].start()
        injected.append(pending.wait(timeout=30.0))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    # the loaded flow, its inference stood in
    stages = replace(engine.stages, flow=cast(Any, _Flow(flow, inference)))
    rows = rows_from_dicts(
        [{"id": f"r{i}", "prompt_audio": str(ROOT / "manifests" / "prompts" / "speaker1.wav"),
          "prompt_text": "reference words", "text": t}
         for i, t in enumerate(["Hello there.", "Short.", "One more line.", "The end."])]
    ).rows
    PROCESS.reset()
    run = Engine(stages, replace(engine.opts, cuda_graphs="on", schedule="continuous",
                                        code2wav_thread=True))
    with captured_with(factory=lambda: SlowCapture(timeline, slow=False)):  # the talker's own captures
        recs = list(run.run(rows))
    for t in side:
        t.join()
    assert injected == [True]  # the OOM was raised while a capture was pending
    assert timeline.captures >= 2 and timeline.frees >= 1  # the side capture and the talker's own
    assert timeline.frees_during_capture == 0
    assert sum(r.status == "failed" for r in recs) <= 1 and len(recs) == 4
    assert run.facts().graphs.disabled is None and graph_pool.PROCESS.disabled is None
