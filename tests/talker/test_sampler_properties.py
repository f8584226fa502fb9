"""Hypothesis properties: random logits with NaN/+inf/-inf patterns and random masks.

For every policy the sampler must never raise, never return a masked / NaN / -inf id for a
row that is not aborted, pick among +inf entries when a row has any (policy "exclude"), and
its counters must equal a plain-Python recount of the same inputs.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cosyclone.talker.sampler import SamplerOptions
from tests.samplers import BatchSampler

VALUES = st.one_of(st.floats(-30, 30, allow_nan=False, width=32), st.just(float("nan")),
                   st.just(float("inf")), st.just(float("-inf")))


@st.composite
def scenario(draw: st.DrawFn) -> dict:
    vocab = draw(st.integers(3, 12))
    s = draw(st.integers(1, vocab - 1))
    b = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 5))
    logits = [[[draw(VALUES) for _ in range(vocab)] for _ in range(b)] for _ in range(steps)]
    min_len = [draw(st.integers(0, 4)) for _ in range(b)]
    return dict(vocab=vocab, s=s, b=b, steps=steps, logits=logits, min_len=min_len,
                policy=draw(st.sampled_from(["exclude", "error", "legacy-zero"])),
                rule=draw(st.sampled_from(["block-all-stop", "official-head"])),
                win=draw(st.integers(1, 4)), top_k=draw(st.integers(1, 5)),
                top_p=draw(st.sampled_from([0.3, 0.8, 1.0])))


@settings(max_examples=60, deadline=None)
@given(scenario())
def test_never_returns_illegal_and_counters_match(sc: dict) -> None:
    b, S = sc["b"], sc["s"]
    opts = SamplerOptions(top_p=sc["top_p"], top_k=sc["top_k"], win_size=sc["win"],
                          nonfinite_policy=sc["policy"], min_len_rule=sc["rule"])
    sampler = BatchSampler(opts, row_ids=[str(i) for i in range(b)], row_seeds=list(range(b)),
                           min_len=sc["min_len"], speech_token_size=S, device="cpu")
    want = [dict(steps=0, nan=0, all_nan=0, posinf=0, no_finite=0, supp=0, restores=0, emitted=0)
            for _ in range(b)]
    hist: list[list[int]] = [[] for _ in range(b)]
    dead = [False] * b
    for step in range(sc["steps"]):
        x = torch.tensor(sc["logits"][step], dtype=torch.float32)
        tokens, aborted = sampler.sample(x, torch.arange(b), step)
        for i in range(b):
            row = sc["logits"][step][i]
            if dead[i]:
                assert bool(aborted[i])
                continue
            w = want[i]
            w["steps"] += 1
            w["nan"] += any(math.isnan(v) for v in row)
            w["all_nan"] += all(math.isnan(v) for v in row)
            w["posinf"] += any(v == math.inf for v in row)
            masked = set()
            if step < sc["min_len"][i]:
                masked = set(range(S, len(row))) if sc["rule"] == "block-all-stop" else {S}
            w["supp"] += any(j in masked and not math.isnan(v) and v != -math.inf for j, v in enumerate(row))
            eff = [-math.inf if j in masked else v for j, v in enumerate(row)]
            if sc["policy"] == "legacy-zero":
                eff = [0.0 if math.isnan(v) else v for v in eff]
            legal = [j for j, v in enumerate(eff) if not math.isnan(v) and v != -math.inf]
            pinf = [j for j, v in enumerate(eff) if v == math.inf]
            has_nan = any(math.isnan(v) for v in eff)
            should_abort = not legal or (sc["policy"] == "error" and (has_nan or bool(pinf)))
            w["no_finite"] += not legal
            assert bool(aborted[i]) == should_abort
            if should_abort:
                dead[i] = True
                continue
            tok = int(tokens[i])
            assert tok in (pinf or legal)
            if len(pinf or legal) == 1 and tok in hist[i][-sc["win"]:]:
                w["restores"] += 1
            hist[i].append(tok)
            w["emitted"] += tok < S
    diags = sampler.finish()
    for i, d in enumerate(diags):
        w = want[i]
        got = dict(steps=d.steps, nan=d.nan_steps, all_nan=d.all_nan_steps, posinf=d.posinf_steps,
                   no_finite=d.no_finite_steps, supp=d.min_len_suppressed, restores=d.ras_sole_restores,
                   emitted=d.tokens_emitted)
        assert got == w
        assert d.ras_fallbacks + d.ras_sole_restores <= d.steps
        assert (d.stop_reason in ("no_finite_logits", "error")) == dead[i]
        if dead[i]:
            assert d.error


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**70), st.integers(0, 50), st.integers(0, 10_000), st.integers(1, 300))
def test_noise_in_open_interval(seed: int, segment: int, step: int, vocab: int) -> None:
    from cosyclone.talker.sampler import stream_key, uniform_noise

    u = uniform_noise(torch.tensor([stream_key(seed, segment)]), step, 0, vocab)
    assert u.shape == (1, vocab) and bool(((u > 0) & (u < 1)).all())
    assert torch.isfinite(torch.log(-torch.log(u))).all()
