"""The verdict's reading of a replay, on made-up steps and layer calls: where it broke, what that
touched, flat logits, and where two replays part."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosyclone.engine.outcome import RowResult
from cosyclone.options import RunOptions
from cosyclone.trace.probes import LayerFacts, StepFacts
from cosyclone.trace.replay import Replay, SegmentTrace
from cosyclone.trace.verdict import diverge, first_break, first_flat, touched

LAYOUT = (("sos", 1), ("prompt text", 3), ("text", 2), ("task", 1), ("prompt speech", 4))


def step(k: int, token: int = 1, *, nan: int = 0, lo: float = -1.0, hi: float = 1.0) -> StepFacts:
    return StepFacts(step=k, token=token, stop=False, aborted=False, top=((token, 0.5), (2, 0.25)),
                     logit_min=lo, logit_max=hi, nan=nan, posinf=0, neginf=0, ras_fallback=False,
                     ras_sole_restore=False, min_len_suppressed=False)


def layer(name: str, call: int, *, bad_at: int | None = None) -> LayerFacts:
    return LayerFacts(stage="talker", name=name, call=call, absmax=1.0, finite=bad_at is None,
                      nonfinite=0 if bad_at is None else 3, first_bad_position=bad_at)


def replay(steps: Sequence[StepFacts], layers: Sequence[LayerFacts] = (),
           logits: Sequence[torch.Tensor] = ()) -> Replay:
    seg = SegmentTrace(segment=0, text="t", layout=LAYOUT, steps=tuple(steps), layers=tuple(layers),
                       tokens=(), stop_reason="eos", logits=tuple(logits))
    return Replay(opts=RunOptions(), stage_dtypes={}, segments=(seg,), code2wav_layers=(),
                  result=RowResult(id="r", line=1, seed=0))


def test_a_break_in_the_prompts_pass_is_named_by_its_earliest_position() -> None:
    calls = [layer("layer 0", 0), layer("layer 1", 0, bad_at=5), layer("norm", 0, bad_at=2)]
    rep = replay([step(0, nan=4)], calls)
    brk = first_break(rep.segments)
    assert brk is not None
    assert (brk.step, brk.where, brk.position, brk.part) == (0, "layer 1", 2, "prompt text")
    assert touched(brk, rep).startswith("prompt:")


def test_a_break_at_the_start_token_is_the_weights_and_finite_layers_point_at_the_head() -> None:
    rep = replay([step(0, nan=4)], [layer("layer 0", 0, bad_at=0)])
    assert touched(first_break(rep.segments), rep).startswith("weights:")
    head = replay([step(0), step(1, nan=2)], [layer("layer 0", 0), layer("layer 0", 1)])
    brk = first_break(head.segments)
    assert brk is not None and (brk.step, brk.where) == (1, "decoder head")
    assert first_break(replay([step(0), step(1)]).segments) is None


def test_flat_logits_are_found_and_two_replays_part_where_they_draw_differently() -> None:
    assert first_flat(replay([step(0), step(1, lo=0.0, hi=0.0)]).segments) == (0, 1, 0.0)
    same = torch.zeros(4)
    a = replay([step(0, 1), step(1, 2), step(2, 3)], logits=[same, same, same])
    b = replay([step(0, 1), step(1, 2), step(2, 9)], logits=[same, same + 0.5, same])
    d = diverge(a, b)
    assert (d.numbers_step, d.max_abs_diff, d.step, d.a, d.b) == (1, 0.5, 2, "token 3", "token 9")
    assert diverge(a, a).step is None and diverge(a, a).numbers_step is None
