"""A night's bookkeeping stays bounded and a long row holds only its own batch (issue 55): the real
scheduler over stand-in stages (tests/stand_in_stages.py), and the batch window it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from typing_extensions import override

from cosyclone.engine.batch_window import BatchWindow
from cosyclone.engine.prefetch import PromptAhead
from cosyclone.engine.stages import PreparedBatch
from cosyclone.manifest import ManifestRow
from tests.stand_in_stages import Costs, Segment, StandInOps, rows, stand_in_engine


class LongFirstRow(StandInOps):
    """Row r0 needs 40 decode windows, every other row 2."""

    @override
    def prepare(self, batch: Sequence[ManifestRow], prompts: PromptAhead | None) -> PreparedBatch:
        prepared = super().prepare(batch, prompts)
        segments: list[Any] = [(rid, Segment(rid, 40 if rid == "r0" else 2)) for rid, _ in prepared.segments]
        prepared.segments = segments
        return prepared


def _run(ordered: bool) -> list[str]:
    costs = Costs(steps=2)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=4, frontend_workers=1)
    pipeline = engine.pipeline(ops=LongFirstRow(costs), ordered=ordered)
    return [r.id for r in pipeline.run([rows(2), rows(2, start=2), rows(2, start=4)])]


def test_a_long_row_holds_only_its_own_batch_when_order_does_not_matter() -> None:
    unordered = _run(ordered=False)
    assert sorted(unordered) == [f"r{i}" for i in range(6)]
    # batches 1 and 2 finish while r0 still decodes: their records come before batch 0's
    assert unordered.index("r2") < unordered.index("r0") and unordered.index("r4") < unordered.index("r0")
    assert _run(ordered=True) == [f"r{i}" for i in range(6)]  # the API's order: batch by batch


def test_the_pipeline_forgets_admitted_batches_and_returned_segments() -> None:
    costs = Costs(steps=2)
    engine = stand_in_engine(costs, batch_size=2, talker_slots=2, frontend_workers=1)
    ops = StandInOps(costs)
    pipeline = engine.pipeline(ops=ops, ordered=False)
    out: list[Any] = []
    for part in range(5):  # five parts of three batches, one pipeline
        out += pipeline.feed([rows(2, start=6 * part + 2 * k) for k in range(3)])
        assert pipeline.batches.base >= pipeline.next - 3  # admitted batches are forgotten as they go
    out += pipeline.drain()
    assert len(out) == 30 and len(pipeline.batches) == 15 and pipeline.batches.base == 15
    assert not pipeline.talker.owner and not pipeline.talker.batches and not pipeline.code2wav.pending
    pipeline.close()


def test_a_batch_window_keeps_run_indices_and_forgets_what_is_behind() -> None:
    window = BatchWindow([rows(2), rows(3, start=2)])
    window.extend([rows(1, start=5)])
    assert len(window) == 3 and window.rows_from(1) == 4 and [r.id for r in window[2]] == ["r5"]
    window.forget_before(2)
    assert len(window) == 3 and window.base == 2 and window.rows_from(0) == 1 and window[2][0].id == "r5"
    with pytest.raises(IndexError, match="batch 1 was forgotten"):
        window[1]
