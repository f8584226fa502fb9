"""The pipeline never waits while it has work, and lives for the whole run: the real scheduler
(:class:`cosyclone.engine.schedule.StageSchedule`) driven by stand-in stages (tests/stand_in_stages.py)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cosyclone.manifest import ManifestRow
from cosyclone.run.drive import LocalSource
from tests.stand_in_stages import Costs, FakeSession, StandInOps, rows, stand_in_engine


def test_decode_steps_go_on_while_the_frontend_is_slow() -> None:
    """Batch 1's frontend does not finish until the talker has run three windows meanwhile: a scheduler
    that waited for it with rows in its slots would never let it finish (the wait times out)."""
    started, release = threading.Event(), threading.Event()
    polls_meanwhile: list[int | bool] = []  # the windows run while batch 1 was prepared, then its release

    def on_prepare(batch: Sequence[ManifestRow]) -> None:
        if batch[0].id == "r2":  # batch 1
            started.set()
            polls_meanwhile.append(release.wait(timeout=20))

    def on_poll(session: FakeSession) -> None:
        if started.is_set() and not release.is_set():
            polls_meanwhile.append(session.polls)
            if len(polls_meanwhile) >= 3:
                release.set()

    costs = Costs(steps=200)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=2, frontend_workers=1)
    ops = StandInOps(costs, on_prepare=on_prepare, on_poll=on_poll)
    out = list(engine.pipeline(ops=ops).run([rows(2), rows(2, start=2)]))
    assert [r.id for r in out] == ["r0", "r1", "r2", "r3"] and all(r.ok for r in out)
    assert polls_meanwhile[-1] is True, "the talker stopped decoding while the frontend prepared batch 1"
    assert len(polls_meanwhile) == 4  # three windows during the slow frontend, then its release


def test_decoding_starts_with_the_first_prepared_batch() -> None:
    """The first decode window runs once the first batch is prepared, not once a slot's worth is."""
    first_window = threading.Event()
    seen: list[bool] = []

    def on_prepare(batch: Sequence[ManifestRow]) -> None:
        if batch[0].id != "r0":
            seen.append(first_window.wait(timeout=20))

    costs = Costs(steps=2)
    engine = stand_in_engine(costs, batch_size=1, talker_slots=4, frontend_workers=1)
    ops = StandInOps(costs, on_prepare=on_prepare, on_poll=lambda s: first_window.set())
    out = list(engine.pipeline(ops=ops).run([rows(1), rows(1, start=1), rows(1, start=2)]))
    assert len(out) == 3 and seen and all(seen)


def test_a_three_part_run_starts_its_prompt_workers_once() -> None:
    """Parts feed one pipeline: one prompt worker thread computes every part's prompts, one talker
    session decodes them, and a part's tail is still in flight when the next part arrives."""
    costs = Costs(steps=2)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=2, frontend_workers=1)
    ops = StandInOps(costs)
    source = LocalSource(lambda: engine, engine.opts, None)
    source.pipeline = engine.pipeline(ops=ops)
    got = []
    for k in range(3):
        got += [r.id for r in source.feed([rows(2, start=4 * k), rows(2, start=4 * k + 2)])]
    got += [r.id for r in source.drain()]
    assert got == [f"r{i}" for i in range(12)]
    frontend = engine.stages.frontend
    assert len(frontend.threads) == 12 and len(set(frontend.threads)) == 1  # type: ignore[attr-defined]
    assert len(ops.sessions) == 1
    assert source.pipeline is None  # drained and closed


def test_the_bound_stage_is_the_slowest_one() -> None:
    """Stage seconds: with a frontend that costs most per row, the frontend bounds the run, and the
    talker's idle-with-work stays small (it never waits on the frontend with rows in its slots)."""
    costs = Costs(frontend_s=0.02, window_s=0.002, steps=2, code2wav_s=0.001)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=4, frontend_workers=1, code2wav_thread=True)
    out = list(engine.pipeline(ops=StandInOps(costs)).run([rows(2, start=2 * k) for k in range(6)]))
    assert len(out) == 12
    seconds = engine.facts().stages
    assert seconds.bound_by == "frontend"
    assert seconds.frontend.busy > seconds.talker.busy and seconds.talker.waiting > 0
    record = engine.facts().as_record()["stages"]
    assert record["bound_by"] == "frontend" and set(record) >= {"frontend", "talker", "code2wav",
                                                                 "talker_idle_with_work"}
