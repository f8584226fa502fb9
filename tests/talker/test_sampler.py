"""Unit and distribution tests for the batched RAS sampler (cosyclone/talker/sampler.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from cosyclone.folder.row_record import RowRecord
from cosyclone.folder.totals import folder_totals
from cosyclone.model.config import SamplingConfig
from cosyclone.talker.diagnostics import SamplerRowDiagnostics
from cosyclone.talker.sampler import COUNTER_NAMES, SamplerOptions, row_seed
from tests.samplers import BatchSampler, legacy_slot_sampler

NEG = float("-inf")
NAN = float("nan")
INF = float("inf")


def make(n: int, *, vocab_s: int = 20, min_len: int = 0, seeds: list[int] | None = None,
         **opts: object) -> BatchSampler:
    return BatchSampler(SamplerOptions(**opts), row_ids=[f"r{i}" for i in range(n)],  # type: ignore[arg-type]
                        row_seeds=seeds if seeds is not None else list(range(n)), min_len=[min_len] * n,
                        speech_token_size=vocab_s, device="cpu")


def chi2(counts: Counter[int], probs: torch.Tensor, n: int) -> float:
    p = probs.double()
    return sum(
        (counts.get(i, 0) - n * float(p[i])) ** 2 / (n * float(p[i])) for i in range(len(p)) if p[i] > 0
    )


# --- options / seeds ------------------------------------------------------------------------------

def test_options_from_config_and_overrides() -> None:
    o = SamplerOptions.from_config(SamplingConfig())
    assert (o.top_p, o.top_k, o.win_size, o.tau_r) == (0.8, 25, 10, 0.1)
    assert o.nonfinite_policy == "exclude" and o.draw == "race" and o.min_len_rule == "block-all-stop"
    assert o.repetition_threshold == pytest.approx(1.0)
    o2 = SamplerOptions.from_config(SamplingConfig(top_k=5), top_p=0.5, nonfinite_policy="legacy-zero")
    assert (o2.top_k, o2.top_p, o2.legacy) == (5, 0.5, True)
    with pytest.raises(ValueError):
        SamplerOptions(nonfinite_policy="zero")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SamplerOptions(top_k=0)


def test_row_seed_stable_and_distinct() -> None:
    assert row_seed(7, "a") == row_seed(7, "a")
    assert len({row_seed(7, "a"), row_seed(7, "b"), row_seed(8, "a")}) == 3
    assert 0 <= row_seed(-3, "x") < 2**63


# --- distribution ---------------------------------------------------------------------------------

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
N_DRAWS = 6000
CHI2_DF7_P1E4 = 29.88  # chi-square critical value, 7 degrees of freedom, p = 1e-4


def _draws(logits: torch.Tensor, **opts: Any) -> Counter[int]:
    s = make(N_DRAWS, vocab_s=100, **opts)
    tokens, aborted = s.sample(logits.expand(N_DRAWS, -1), torch.arange(N_DRAWS), 0)
    assert not aborted.any()
    return Counter(tokens.tolist())


def test_race_full_distribution_matches_softmax() -> None:
    counts = _draws(LOGITS, top_p=1.0, top_k=100)
    assert chi2(counts, torch.softmax(LOGITS, 0), N_DRAWS) < CHI2_DF7_P1E4
    # the bound has power: a slightly wrong distribution (temperature 0.8) and uniform are rejected
    assert chi2(counts, torch.softmax(LOGITS / 0.8, 0), N_DRAWS) > CHI2_DF7_P1E4
    assert chi2(counts, torch.full((8,), 1 / 8), N_DRAWS) > CHI2_DF7_P1E4


def test_race_across_steps_matches_softmax() -> None:
    """One row, many steps (win_size large enough to never repeat-check is impossible; use tau_r huge)."""
    s = make(1, vocab_s=100, top_p=1.0, top_k=100, tau_r=1e9)
    toks = [int(s.sample(LOGITS[None], torch.tensor([0]), k)[0][0]) for k in range(3000)]
    assert chi2(Counter(toks), torch.softmax(LOGITS, 0), 3000) < CHI2_DF7_P1E4


def test_nucleus_distribution_matches_renormalized_kept() -> None:
    p = torch.softmax(LOGITS, 0)
    # LOGITS is sorted: keep while the sum before an entry is < 0.8
    cum = torch.cumsum(p, 0)
    n_keep = int((torch.cat([torch.zeros(1), cum[:-1]]) < 0.8).sum())
    assert 3 <= n_keep <= 5
    kept = torch.zeros(8)
    kept[:n_keep] = p[:n_keep] / p[:n_keep].sum()
    counts = _draws(LOGITS)
    assert set(counts) <= set(range(n_keep))
    crit = {2: 18.42, 3: 21.11, 4: 23.51}[n_keep - 1]  # chi-square p = 1e-4 by degrees of freedom
    assert chi2(counts, kept, N_DRAWS) < crit
    assert chi2(counts, torch.softmax(LOGITS[:n_keep] / 0.8, 0), N_DRAWS) > crit  # wrong dist rejected
    top_k = _draws(LOGITS, top_k=3)
    assert set(top_k) <= {0, 1, 2}
    assert chi2(top_k, p[:3] / p[:3].sum(), N_DRAWS) < 21.1  # df=2, p=1e-4 is 18.4; margin


def test_ras_fallback_distribution_excludes_repeat() -> None:
    """History holds the arg-max; with top_k=1 the fallback draws softmax minus that id."""
    n = N_DRAWS
    s = make(n, vocab_s=100, top_k=1)
    rows = torch.arange(n)
    x0 = torch.full((n, 8), NEG)
    x0[:, 0] = 0.0
    s.sample(x0, rows, 0)
    tokens, _ = s.sample(LOGITS.expand(n, -1), rows, 1)
    q = torch.softmax(LOGITS, 0)
    q[0] = 0.0
    q = q / q.sum()
    counts = Counter(tokens.tolist())
    assert 0 not in counts
    assert chi2(counts, q, n) < 27.9  # df=6
    assert sum(d.ras_fallbacks for d in s.finish()) == n


# --- RAS specifics --------------------------------------------------------------------------------

def test_sole_token_restore_at_nonzero_index() -> None:
    s = make(1, vocab_s=50)
    x = torch.full((1, 60), NEG)
    x[0, 37] = -2.0
    for step in range(3):
        tok, aborted = s.sample(x, torch.tensor([0]), step)
        assert int(tok[0]) == 37 and not bool(aborted[0])
    d = s.finish()[0]
    assert (d.ras_sole_restores, d.ras_fallbacks, d.steps, d.tokens_emitted) == (2, 0, 3, 3)


def test_repeat_outside_window_does_not_trigger() -> None:
    s = make(1, vocab_s=50, win_size=3, top_k=1)
    for step, tok in enumerate([5, 1, 2, 3]):
        x = torch.full((1, 60), NEG)
        x[0, tok] = 0.0
        s.sample(x, torch.tensor([0]), step)
    x = torch.zeros((1, 60))
    x[0, 5] = 5.0
    assert int(s.sample(x, torch.tensor([0]), 4)[0][0]) == 5
    assert s.finish()[0].ras_fallbacks == 0


# --- min length -----------------------------------------------------------------------------------

def test_min_len_block_all_stop_and_official_head() -> None:
    vs = 10
    x = torch.full((64, 16), -5.0)
    x[:, vs:] = 5.0  # stop ids dominate
    for rule, forbidden in (("block-all-stop", set(range(vs, 16))), ("official-head", {vs})):
        s = make(64, vocab_s=vs, min_len=3, min_len_rule=rule, top_p=1.0, top_k=100)
        rows = torch.arange(64)
        for step in range(3):
            tokens, _ = s.sample(x, rows, step)
            assert not (set(tokens.tolist()) & forbidden), rule
        tokens, _ = s.sample(x, rows, 3)  # after min_len stopping is allowed (and likely)
        assert (tokens >= vs).any()
        assert all(d.min_len_suppressed == 3 for d in s.finish())


# --- non-finite policies --------------------------------------------------------------------------

def test_exclude_aborts_only_the_bad_row() -> None:
    s = make(3)
    x = torch.randn(3, 30)
    x[1] = NAN
    x[2, :29] = NAN
    tokens, aborted = s.sample(x, torch.arange(3), 0)
    assert aborted.tolist() == [False, True, False]
    assert int(tokens[2]) == 29 and int(tokens[1]) >= 20
    tokens, aborted = s.sample(torch.randn(3, 30), torch.arange(3), 1)
    assert aborted.tolist() == [False, True, False]  # stays aborted
    d = s.finish(stop_reasons=["max_len", None, None])
    assert d[1].stop_reason == "no_finite_logits" and d[1].all_nan_steps == 1 and d[1].steps == 1
    assert d[0].stop_reason == "max_len" and d[2].nan_steps == 1
    assert d[2].stop_reason in (None, "stop_token")  # "stop_token" only if a stop id was returned
    assert sum(x.all_nan_steps for x in d) == 1


def test_posinf_row_picks_uniformly_among_posinf() -> None:
    n = 2000
    s = make(n, vocab_s=100)
    x = torch.randn(n, 12)
    x[:, [3, 8, 11]] = INF
    x[:, 5] = NAN
    tokens, aborted = s.sample(x, torch.arange(n), 0)
    assert not aborted.any()
    c = Counter(tokens.tolist())
    assert set(c) == {3, 8, 11}
    assert chi2(c, torch.tensor([0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1]) / 3.0, n) < 18.4  # df=2


def test_error_policy_aborts_with_message() -> None:
    s = make(2, nonfinite_policy="error")
    x = torch.randn(2, 30)
    x[0, 4] = NAN
    tokens, aborted = s.sample(x, torch.arange(2), 2)
    assert aborted.tolist() == [True, False]
    d = s.finish()
    assert d[0].stop_reason == "error" and "step 2" in (d[0].error or "") and "1 NaN" in (d[0].error or "")
    assert d[1].stop_reason in (None, "stop_token") and d[1].error is None


def test_legacy_zero_is_labelled_and_samples_all_nan() -> None:
    s = make(1, nonfinite_policy="legacy-zero")
    tokens, aborted = s.sample(torch.full((1, 30), NAN), torch.tensor([0]), 0)
    assert not bool(aborted[0])
    d = s.finish()[0]
    assert d.legacy and d.to_dict()["legacy"] and d.policy == "legacy-zero"


def test_legacy_multinomial_runs_and_respects_masks() -> None:
    """The product's LEGACY draw (its exact draws are checked against the official capture in
    tests/parity/test_sampling_parity.py) keeps the masks: no stop id below min_len, no -inf id."""
    s = legacy_slot_sampler(SamplerOptions(draw="legacy-multinomial"), [0, 1, 2, 3], speech_token_size=20,
                            vocab=30, min_len=[5] * 4)
    x = torch.randn(4, 30)
    x[:, 7] = NEG
    x[3] = NAN
    tokens, aborted = s(x, torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.int64))
    assert aborted.tolist() == [False, False, False, True]
    assert all(t < 20 and t != 7 for t in tokens[:3].tolist())
    counters = dict(zip(COUNTER_NAMES, s.state_rows()[:, :len(COUNTER_NAMES)].T.tolist(), strict=True))
    assert counters["min_len_suppressed"] == [1, 1, 1, 0] and counters["all_nan_steps"] == [0, 0, 0, 1]


# --- batch independence ---------------------------------------------------------------------------

@pytest.mark.parametrize("draw", ["race", "legacy-multinomial"])
def test_batch_independence(draw: str) -> None:
    """A row draws the same tokens alone, first or last in a batch: the reference sampler for the
    race draw, the product's in-step sampler for the LEGACY draw (which only the product has)."""
    torch.manual_seed(0)
    steps, vocab = 12, 40
    logits = torch.randn(steps, 8, vocab) * 2  # step, batch slot, vocab
    target = torch.randn(steps, vocab) * 2

    def run(pos: int, n: int) -> list[int]:
        seeds = [row_seed(1, f"o{i}") for i in range(n)]
        seeds[pos] = row_seed(1, "target")
        opts = SamplerOptions(draw=draw)  # type: ignore[arg-type]
        if draw == "race":
            s = BatchSampler(opts, row_ids=[f"o{i}" for i in range(n)], row_seeds=seeds, min_len=[4] * n,
                             speech_token_size=30, device="cpu")
            draw_step = lambda x, k: s.sample(x, torch.arange(n), k)[0]  # noqa: E731
        else:
            slots = legacy_slot_sampler(opts, seeds, speech_token_size=30, vocab=vocab, min_len=[4] * n)
            live = torch.ones(n, dtype=torch.bool)
            draw_step = lambda x, k: slots(x, live, torch.full((n,), k))[0]  # noqa: E731
        out = []
        for k in range(steps):
            x = logits[k, :n].clone()
            x[pos] = target[k]
            out.append(int(draw_step(x, k)[pos]))
        return out

    alone = run(0, 1)
    assert run(0, 8) == alone
    assert run(7, 8) == alone


def test_subset_rows_and_history() -> None:
    """Rows leave the batch: passing a subset by index keeps each row's own stream."""
    torch.manual_seed(1)
    x = torch.randn(6, 3, 25)
    full = make(3, vocab_s=20)
    part = make(3, vocab_s=20)
    a = [full.sample(x[k], torch.arange(3), k)[0] for k in range(6)]
    b = [part.sample(x[k, [2]], torch.tensor([2]), k)[0] for k in range(6)]
    assert [int(t[2]) for t in a] == [int(t[0]) for t in b]


def test_diagnostics_dataclass() -> None:
    d = SamplerRowDiagnostics(row_id="a", seed=1, steps=81, all_nan_steps=46, nan_steps=46)
    # the run's totals word it like the bug report that motivated the counters
    record = RowRecord.from_json({"id": "a", "status": "ok", "sampler": [d.to_dict()]})
    assert record is not None and record.sampler == (d,)  # the counters read back as written
    totals = folder_totals([record])
    assert totals["nan_summary"] == "81 sampler calls, 46 entirely NaN"
    assert d.to_dict()["row_id"] == "a" and not d.aborted


# --- seeds, segments and the 64-bit noise key -----------------------------------------------------

def test_the_seed_given_is_the_seed_reported_with_its_segment() -> None:
    s = BatchSampler(SamplerOptions(), row_ids=["a", "a", "b"], row_seeds=[123, 123, 2**70 + 5],
                     segments=[0, 1, 0], min_len=[0] * 3, speech_token_size=20, device="cpu")
    s.sample(torch.zeros(3, 25), torch.arange(3), 0)
    d = s.finish()
    assert [(x.seed, x.segment) for x in d] == [(123, 0), (123, 1), (2**70 + 5, 0)]
    assert d[1].to_dict()["seed"] == 123 and d[1].to_dict()["segment"] == 1


def test_each_segment_of_a_row_draws_its_own_noise() -> None:
    """Same row, same seed, same logits: segment 1 must not replay segment 0's random numbers."""
    steps, vocab = 40, 64
    logits = torch.zeros(steps, vocab)  # uniform: the token is decided by the noise alone
    s = BatchSampler(SamplerOptions(top_p=1.0, top_k=vocab, win_size=1, tau_r=100.0), row_ids=["a", "a"],
                     row_seeds=[7, 7], segments=[0, 1], min_len=[steps] * 2, speech_token_size=vocab - 1,
                     device="cpu")
    toks = [s.sample(logits[k].expand(2, -1), torch.arange(2), k)[0].tolist() for k in range(steps)]
    same = sum(a == b for a, b in toks)
    assert same <= 6, toks  # independent uniform draws over 63 ids agree ~0.6 times in 40 steps


def test_segment_streams_are_batch_invariant() -> None:
    """A row's second segment gets the same tokens alone as next to its first segment and other rows."""
    torch.manual_seed(3)
    steps, vocab = 10, 40
    logits = torch.randn(steps, 5, vocab) * 2

    def run(order: list[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
        s = BatchSampler(SamplerOptions(), row_ids=[f"r{r}" for r, _ in order],
                         row_seeds=[row_seed(9, f"r{r}") for r, _ in order], segments=[g for _, g in order],
                         min_len=[4] * len(order), speech_token_size=30, device="cpu")
        out: dict[tuple[int, int], list[int]] = {key: [] for key in order}
        for k in range(steps):
            x = torch.stack([logits[k, 2 * r + g] for r, g in order])
            tokens, _ = s.sample(x, torch.arange(len(order)), k)
            for key, t in zip(order, tokens.tolist(), strict=True):
                out[key].append(t)
        return out

    together = run([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)])
    for key in together:
        assert run([key])[key] == together[key], key
    assert run([(1, 1), (0, 1), (2, 0), (0, 0), (1, 0)]) == together  # position in the batch is irrelevant


def test_noise_uses_all_64_key_bits() -> None:
    """Keys equal in their low (or high) 32 bits still get unrelated noise; and it is a pure function."""
    from cosyclone.talker.sampler import stream_key, uniform_noise

    def signed(k: int) -> int:
        k &= (1 << 64) - 1
        return k - (1 << 64) if k >= (1 << 63) else k

    base = stream_key(1, 0)
    keys = torch.tensor([signed(base ^ m) for m in (0, 1 << 40, 1, 1 << 63)], dtype=torch.int64)
    u = uniform_noise(keys, 5, 0, 4096)
    for i in range(1, 4):
        assert (u[0] == u[i]).float().mean() < 0.01, i  # 24-bit uniforms: equal entries are rare
    torch.testing.assert_close(uniform_noise(keys[[2, 0]], 5, 0, 4096), u[[2, 0]], rtol=0, atol=0)
    assert not torch.equal(uniform_noise(keys[:1], 6, 0, 4096), u[:1])  # step is part of the counter
    assert not torch.equal(uniform_noise(keys[:1], 5, 1, 4096), u[:1])  # so is the draw index
    # distinct (seed, segment) pairs, including seeds that agree modulo 2**32 or 2**64, get distinct keys
    pairs = [(s, g) for s in (0, 1, 2**32, 2**32 + 1, 2**64, 2**64 + 1) for g in (0, 1, 2)]
    assert len({stream_key(s, g) for s, g in pairs}) == len(pairs)
    assert all(-(2**63) <= stream_key(s, g) < 2**63 for s, g in pairs)


def test_keys_a_32_bit_fold_would_merge_get_different_noise() -> None:
    """The old key was ``mix(mix(lo ^ c) ^ hi)``: 32 bits, so for any key another one folds onto it
    (mix is a bijection: pick hi2 to match). Such a pair must still get different noise now."""
    from cosyclone.talker.sampler import _mix32, uniform_noise

    def fold32(key: int) -> int:
        lo, hi = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
        return int(_mix32(int(_mix32(lo ^ 0x2545F491)) ^ hi))

    lo1, hi1, lo2 = 0x12345678, 0x0BADBEEF, 0x0FEDCBA9
    hi2 = int(_mix32(lo1 ^ 0x2545F491)) ^ hi1 ^ int(_mix32(lo2 ^ 0x2545F491))
    k1, k2 = (hi1 << 32) | lo1, (hi2 << 32) | lo2
    k2 = k2 - (1 << 64) if k2 >= (1 << 63) else k2
    assert k1 != k2 and fold32(k1) == fold32(k2 & ((1 << 64) - 1))  # one stream under a 32-bit key
    u = uniform_noise(torch.tensor([k1, k2], dtype=torch.int64), 0, 0, 4096)
    assert (u[0] == u[1]).float().mean() < 0.01
