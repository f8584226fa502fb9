"""A projection you can trust: the real scheduler, driven by stand-in stages of set costs (injected
through ``Engine.pipeline(ops=...)``), is bound by the stage :func:`cosyclone.engine.projection.project`
names for those costs, and never beats the pace it projects."""

from __future__ import annotations

import pytest

from cosyclone.engine.projection import H100, StageCosts, project
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
        c, rows=ROWS, row_seconds=1.0, slots=SLOTS, prompt_workers=WORKERS, tokens_per_row=TOKENS
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
        "ESTIMATE" in s for s in H100.sources if "OFFICIAL" not in s
    )
