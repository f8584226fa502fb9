"""The talker's scheduler and step runner apart (``cosyclone/talker/scheduler.py``, ``step_runner.py``):
admission within the prefill budget, one object per segment through its statuses, and the eager
fallback after a failed capture reserving its cache up front."""

from __future__ import annotations

from dataclasses import replace

import torch

from cosyclone.talker import DecodeOptions, TalkerRequest, TalkerSession
from cosyclone.talker.graph_pool import PROCESS
from cosyclone.talker.scheduler import SlotScheduler
from cosyclone.talker.sequence import Seq
from tests.talker.test_engine_equivalence import _requests
from tests.talker.test_talker_decode import _model


def _seq(t: int, prompt_len: int, max_len: int = 5) -> Seq:
    return Seq(ticket=t, request=None, key=t, prompt_len=prompt_len, min_len=0, max_len=max_len)


def test_newcomers_fill_the_lowest_free_slots_within_the_prefill_budget() -> None:
    sched = SlotScheduler(4, prefill_tokens=20)
    seqs = [_seq(0, 8), _seq(1, 6), _seq(2, 9), _seq(3, 30), _seq(4, 3, max_len=0)]
    for s in seqs:
        sched.add(s)
    assert seqs[4].status == "finished" and sched.finished == [seqs[4]]  # nothing to generate: no slot
    first = sched.admissions()
    assert first == seqs[:2] and [s.slot for s in first] == [0, 1]  # a third would pad 3 x 9 > 20 positions
    assert all(s.status == "running" for s in first)
    assert sched.admissions() == [seqs[2]] and seqs[2].slot == 2  # alone: 9 positions
    assert sched.admissions() == [seqs[3]] and seqs[3].slot == 3  # longer than the budget: still goes, alone
    sched.release(seqs[0])
    assert sched.slots[0] is None and seqs[0].slot is None and not sched.holds(0, seqs[0])
    gone = sched.abort_all()
    assert set(gone) == {seqs[1], seqs[2], seqs[3]} and all(s.status == "aborted" for s in gone)


def test_a_prefill_budget_gives_the_same_tokens() -> None:
    """Admitting fewer newcomers per prefill changes when rows start, not what they decode."""
    model = _model()
    reqs = _requests(7, seed=3)
    out = {}
    for budget in (None, 1, 40):
        session = TalkerSession(model, DecodeOptions(prefill_tokens=budget), slots=4)
        session.add(reqs)
        out[budget] = [r.raw_tokens for _, r in sorted(session.drain(), key=lambda tr: tr[0])]
        session.close()
    assert out[None] == out[1] == out[40]


def test_the_eager_fallback_after_a_failed_capture_reserves_its_cache() -> None:
    """Once a capture failed, sessions decode eagerly on their own step: it still starts with the
    sized cells per slot, instead of one cell grown by reallocation as rows arrive."""
    model = _model()
    PROCESS.disable("a capture failed (test)")
    opts = DecodeOptions(cuda_graphs="on", reserve_positions=256)
    session = TalkerSession(model, opts, slots=3)
    assert (
        session.runner.graphed is None
        and session.runner.engine.capacity == 256
        and session.runner.engine.token_capacity == 256
    )
    grown: list[int] = []
    real = session.runner.engine.grow

    def grow(capacity: int, token_capacity: int) -> bool:
        grown.append(capacity)
        return real(capacity, token_capacity)

    session.runner.engine.grow = grow  # type: ignore[method-assign]
    session.add([replace(r, seed=1) for r in _requests(4, seed=1)])
    session.drain()
    session.close()
    assert grown == []  # the rows fit the reserved cells: no reallocation


def test_a_session_keeps_one_object_per_segment() -> None:
    model = _model()
    session = TalkerSession(model, DecodeOptions(), slots=2)
    reqs: list[TalkerRequest] = _requests(3, seed=2)
    session.add(reqs)
    seqs = list(session.seqs.values())
    assert [s.status for s in seqs] == ["waiting"] * 3 and [s.ticket for s in seqs] == [0, 1, 2]
    with torch.no_grad():
        session.poll()
    slot_row = [s.ticket if s is not None else None for s in session.scheduler.slots]  # tickets by slot
    assert sum(s.status == "running" for s in seqs) == 2 and slot_row == [0, 1]
    session.drain()
    assert all(s.status == "finished" and s.request is None and s.harvest is None for s in seqs)
    session.close()
