"""Decode cost follows the live rows: a step runs over the smallest slot bucket that holds every
running row, a long row left alone in a high slot is moved down, and none of it changes a token."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import pytest

from cosyclone.talker import DecodeOptions, StepMechanics, TalkerSession, generate
from cosyclone.talker.graphs import EagerCapture
from cosyclone.talker.occupancy import PROCESS_OCCUPANCY
from cosyclone.talker.sampler import SamplerOptions
from cosyclone.talker.scheduler import SlotScheduler, bucket_for, decode_buckets
from cosyclone.talker.sequence import Seq
from tests.capture import captured_with
from tests.talker.test_engine_equivalence import _key
from tests.talker.test_talker_decode import _model, _req

# min = max length ratio: every row runs exactly 2 x its target text ids
OPTS = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=0.9), min_len_ratio=2.0, max_len_ratio=2.0,
                     mechanics=StepMechanics(kv_bucket=8))


def _seq(ticket: int) -> Seq:
    return Seq(ticket=ticket, request=None, key=ticket, prompt_len=3, min_len=0, max_len=5)


def test_buckets_hold_every_count_up_to_the_slots() -> None:
    assert decode_buckets(256)[-3:] == (128, 192, 256) and decode_buckets(10) == (1, 2, 4, 8, 10)
    assert [bucket_for(n, decode_buckets(256)) for n in (1, 3, 16, 17, 200)] == [1, 4, 16, 24, 256]


def test_compact_moves_a_lone_high_row_down_unless_waiting_rows_fill_the_gaps() -> None:
    sched = SlotScheduler(16)
    for t in range(16):
        sched.add(_seq(t))
    sched.admissions()
    for seq in list(sched.running)[:-1]:  # every row but the one in slot 15 finishes
        sched.release(seq)
    assert sched.bucket() == 16
    sched.add(_seq(16))  # one waiting row: 2 rows after admission fit bucket 2, the lone row still moves
    assert sched.compact() == [(15, 0)] and sched.bucket() == 1 and sched.slots[0] is not None
    assert sched.admissions()[0].slot == 1 and sched.bucket() == 2
    for t in range(17, 40):
        sched.add(_seq(t))
    sched.slots[1], sched.slots[9] = None, sched.slots[1]  # a row in slot 9, with enough waiting to fill
    assert sched.compact() == []


def _rows() -> list:
    """Seven short rows, then a long one: admitted together, the long one takes the highest slot."""
    return [replace(_req(40 + i, 4, 2, 1 if i < 7 else 9), row_id=f"row{i}", seed=7 + i) for i in range(8)]


@pytest.mark.parametrize("graphs,draw", [(False, "race"), (True, "race"), (False, "legacy-multinomial")],
                         ids=["eager", "graphs", "legacy-draw"])
def test_a_long_row_in_a_high_slot_moves_down_and_every_token_stays(
    graphs: bool, draw: Literal["race", "legacy-multinomial"]
) -> None:
    """The move takes the row's cache, state, sampler counters and (LEGACY draw) its generator along."""
    model, reqs = _model(), _rows()
    opts = replace(OPTS, sampler=replace(SamplerOptions(top_k=40, top_p=0.9), draw=draw))
    alone = [_key(generate(model, [r], replace(opts, cuda_graphs="off")))[0] for r in reqs]
    before = PROCESS_OCCUPANCY.figures()
    with captured_with(EagerCapture() if graphs else None):
        session = TalkerSession(model, opts if graphs else replace(opts, cuda_graphs="off"), slots=8)
        session.add(reqs)
        got = [r for _, r in sorted(session.drain(), key=lambda tr: tr[0])]
        session.close()
    ran = PROCESS_OCCUPANCY.figures().since(before)
    key = _key(got)
    if graphs:  # what ran as a replay is not what ran alone eagerly: compare the rest
        key = [(*k[:-1], {n: v for n, v in k[-1].items() if n != "graph_steps"}) for k in key]
        alone = [(*k[:-1], {n: v for n, v in k[-1].items() if n != "graph_steps"}) for k in alone]
    assert key == alone
    assert len(got[7].raw_tokens) > 2 * len(got[0].raw_tokens)  # the long row outlived the others
    assert ran.moves == 1 and set(ran.buckets) == {1, 8}  # moved to slot 0, then stepped alone
    assert ran.buckets[1] >= 8 and 1.0 < (ran.mean_live_slots or 0) < 8.0
