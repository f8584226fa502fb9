"""Fault injection through the talker: chosen rows go all-NaN at chosen steps.

The diagnostics must report exactly those events and abort exactly those rows (under the default
``exclude`` policy), while the other rows of the batch carry on; the LEGACY ``legacy-zero`` policy
reproduces the historical failure (uniform draws, rows keep going) with the same counts.
"""

from __future__ import annotations

import torch

from cosyclone.options import NonfinitePolicy
from cosyclone.talker import DecodeOptions, TalkerResult
from cosyclone.talker.sampler import SamplerOptions
from tests.host_session import host_generate
from tests.samplers import diag
from tests.talker.test_talker_decode import _model, _req

STEPS = 6
NAN_AT = {1: {2, 3, 5}, 3: {0}}  # row index -> steps whose logits are entirely NaN
PARTIAL_AT = {2: {1, 4}}  # row index -> steps with a single NaN entry (still has finite candidates)


def _hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
    out = logits.clone()
    for pos, row in enumerate(rows.tolist()):
        if step in NAN_AT.get(row, ()):
            out[pos] = float("nan")
        if step in PARTIAL_AT.get(row, ()):
            out[pos, 3] = float("nan")
    return out


def _run(policy: NonfinitePolicy) -> list[TalkerResult]:
    model = _model()
    # target_len 5 -> min_len 10 > STEPS: no row may stop early, so every step is sampled.
    reqs = [_req(i, 3 + 4 * i, i, 5) for i in range(4)]
    options = DecodeOptions(sampler=SamplerOptions(nonfinite_policy=policy), max_len_override=STEPS)
    return host_generate(model, reqs, options, logits_hook=_hook)  # the product's own in-step sampler draws


def test_exclude_aborts_exactly_the_all_nan_rows_at_their_first_nan_step() -> None:
    results = _run("exclude")
    reasons = [r.stop_reason for r in results]
    assert reasons == ["max_len", "no_finite_logits", "max_len", "no_finite_logits"]
    d = [diag(r) for r in results]
    # row 1 dies at step 2 (steps 0, 1 emitted), row 3 at step 0 (nothing emitted)
    assert [len(r.raw_tokens) for r in results] == [STEPS, 2, STEPS, 0]
    assert [x.all_nan_steps for x in d] == [0, 1, 0, 1]
    assert [x.no_finite_steps for x in d] == [0, 1, 0, 1]
    assert [x.nan_steps for x in d] == [0, 1, 2, 1]
    assert [x.steps for x in d] == [STEPS, 3, STEPS, 1]
    # "sampler calls"
    assert sum(x.steps for x in d) == 2 * STEPS + 4 and sum(x.all_nan_steps for x in d) == 2


def test_legacy_zero_reproduces_the_old_failure_with_exact_counts() -> None:
    results = _run("legacy-zero")
    assert all(r.stop_reason == "max_len" for r in results)  # NaN rows silently became draws
    d = [diag(r) for r in results]
    assert [x.all_nan_steps for x in d] == [0, 3, 0, 1]
    assert [x.nan_steps for x in d] == [0, 3, 2, 1]
    assert sum(x.steps for x in d) == 4 * STEPS and sum(x.all_nan_steps for x in d) == 4
    assert all(x.legacy for x in d)
