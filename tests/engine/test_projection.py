"""A projection you can trust: the real scheduler, driven by stand-in stages of set costs (injected
through ``Engine.pipeline(ops=...)``), is bound by the stage :func:`cosyclone.engine.projection.project`
names for those costs, and never beats the pace it projects. Stand-in stages only sleep, side by
side, so they are projected as two devices; a real run's talker and code2wav share one, and the
projection and the run's own account both add their seconds up there."""

from __future__ import annotations

import pytest

from cosyclone.engine.facts import StageSeconds, StageTime
from cosyclone.engine.projection import CPU, H100, MEASURED_PROMPT_S, StageCosts, project
from tests.stand_in_stages import Costs, StandInOps, rows, stand_in_engine

SLOTS, WORKERS, TOKENS, ROWS = 4, 2, 5, 24

CASES = {
    "frontend": StageCosts(
        "stand-in", prompt_s=0.06, text_s=0.001, step_s=0.004, code2wav_s=0.005, sources=()
    ),
    "talker": StageCosts("stand-in", prompt_s=0.004, text_s=0.001, step_s=0.02, code2wav_s=0.005, sources=()),
    "code2wav": StageCosts(
        "stand-in", prompt_s=0.004, text_s=0.001, step_s=0.002, code2wav_s=0.04, sources=()
    ),
}


@pytest.mark.parametrize("bound", list(CASES))
def test_the_scheduler_is_bound_where_the_projection_says(bound: str) -> None:
    c = CASES[bound]
    projected = project(
        c, rows=ROWS, row_seconds=1.0, slots=SLOTS, prompt_workers=WORKERS, tokens_per_row=TOKENS,
        shared_device=False,
    )
    assert projected.bound_by == bound
    costs = Costs(
        frontend_s=c.text_s, prompt_s=c.prompt_s, window_s=c.step_s, code2wav_s=c.code2wav_s, steps=TOKENS
    )
    engine = stand_in_engine(
        costs, batch_size=2, talker_slots=SLOTS, frontend_workers=WORKERS, code2wav_thread=True
    )
    out = list(engine.pipeline(ops=StandInOps(costs)).run([rows(2, start=2 * k) for k in range(ROWS // 2)]))
    assert len(out) == ROWS and all(r.ok for r in out)
    measured = engine.facts().stages
    assert measured.bound_by == bound, measured
    rows_per_s = ROWS / measured.wall
    print(f"{bound}: measured {rows_per_s:.1f} rows/s, projected {projected.run_rows_per_s:.1f}")
    assert rows_per_s <= 1.15 * projected.run_rows_per_s  # no stage can outrun the bound's pace


def test_the_h100_table_projects_ten_thousand_distinct_prompt_rows() -> None:
    p = project(H100, rows=10_000, row_seconds=10.0, slots=256, prompt_workers=14)
    assert p.bound_by == "frontend" and p.rows_per_s["talker"] > p.run_rows_per_s
    assert "bound by frontend" in p.describe() and all(
        "ESTIMATE" in s or "MEASURED" in s for s in H100.sources
    )


def test_the_frontend_figure_is_the_released_geometrys_measurement_with_its_machine() -> None:
    """Both tables take the prompt cost measured on the frontend of the released geometry
    (benchmarks/released_frontend.py), and say so with the machine it was measured on."""
    for table in (H100, CPU):
        assert table.prompt_s == MEASURED_PROMPT_S
        (line,) = [s for s in table.sources if s.startswith("prompt_s")]
        assert "MEASURED" in line and "released_frontend" in line and "AMD EPYC" in line
        assert "ESTIMATE" not in line


def test_one_device_adds_the_talker_and_code2wav_up() -> None:
    """Talker and code2wav each faster than the frontend, but together on one device slower: the
    device bounds the run; read as two devices, the frontend would."""
    c = StageCosts("stand-in", prompt_s=0.03, text_s=0.001, step_s=0.01, code2wav_s=0.012, sources=())
    kw = dict(rows=ROWS, row_seconds=1.0, slots=SLOTS, prompt_workers=WORKERS, tokens_per_row=TOKENS)
    apart, shared = project(c, shared_device=False, **kw), project(c, **kw)  # type: ignore[arg-type]
    assert apart.bound_by == "frontend" and "device" not in apart.rows_per_s
    assert shared.bound_by == "device" and "bound by device" in shared.describe()
    per = shared.rows_per_s
    assert per["device"] == pytest.approx(1 / (1 / per["talker"] + 1 / per["code2wav"]))
    assert per["talker"] > per["frontend"] and per["code2wav"] > per["frontend"] > per["device"]


def test_the_run_account_names_the_device_when_its_stages_share_it() -> None:
    """The same seconds, read as one device and as two: the talker alone is the busiest stage,
    but the talker and code2wav together outweigh the frontend on their one device."""
    t = lambda busy: StageTime(busy=busy, waiting=10.0 - busy)  # noqa: E731
    kw = dict(wall=10.0, frontend=t(6.0), talker=t(5.0), code2wav=t(3.5), talker_idle_with_work=0.0)
    shared, apart = StageSeconds(**kw), StageSeconds(shared_device=False, **kw)  # type: ignore[arg-type]
    assert apart.bound_by == "frontend" and shared.bound_by == "device"
    assert shared.shares == pytest.approx({"frontend": 0.6, "talker": 0.5, "code2wav": 0.35, "device": 0.85})
    record = shared.as_record()
    assert record["bound_by"] == "device" and record["shared_device"] is True
    assert record["shares"]["device"] == pytest.approx(0.85) and "device" not in apart.as_record()["shares"]
    assert "talker + code2wav on one device 85%" in shared.describe()


def test_a_scheduled_run_on_one_device_is_bound_by_the_device() -> None:
    """The real scheduler over stand-in stages that say they share one device: the talker's and
    code2wav's seconds add up in the run's account, which names the device as the bound."""
    costs = Costs(frontend_s=0.004, prompt_s=0.0, window_s=0.006, code2wav_s=0.01, steps=TOKENS)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=SLOTS, frontend_workers=WORKERS,
                             code2wav_thread=True)
    ops = StandInOps(costs, shared_device=True)
    out = list(engine.pipeline(ops=ops).run([rows(2, start=2 * k) for k in range(6)]))
    assert len(out) == 12 and all(r.ok for r in out)
    seconds = engine.facts().stages
    assert seconds.shared_device and seconds.bound_by == "device", seconds
    assert seconds.shares["device"] == pytest.approx(seconds.shares["talker"] + seconds.shares["code2wav"])
    assert engine.facts().as_record()["stages"]["shares"]["device"] > 0
