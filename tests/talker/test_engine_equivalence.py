"""The slot engine equals today's sampler and decode loop exactly: same tokens, same stop reasons,
same diagnostics counters, for every seed, batch size, slot count, admission order and for
NaN/+inf-injected logits; the top-k nucleus equals the sorted one, ties included."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cosyclone.talker import DecodeOptions, StepMechanics, TalkerRequest, generate, prompt_length
from cosyclone.talker.sampler import SamplerOptions, nucleus_keep, stream_key
from cosyclone.talker.slot_sampler import SlotSampler
from tests.host_session import HostSession, LogitsHook, host_generate
from tests.reference_decode import reference_generate
from tests.samplers import BatchSampler, diag, nucleus_keep_sorted
from tests.talker.test_talker_decode import _model, _req

S, V = 40, 240


def _logits(b: int, steps: int, seed: int) -> torch.Tensor:
    """(steps, b, V) logits with ties, stop ids, NaN, -inf and +inf sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, b, V, generator=g) * 3
    x[:, :, 60:90] = x[:, :, 60:61]  # a block of exactly tied logits
    r = torch.rand(steps, b, generator=g)
    x[r < 0.06] = float("nan")  # whole rows NaN
    x[(r > 0.06) & (r < 0.1)] = float("-inf")  # whole rows -inf
    x[:, :, 5][torch.rand(steps, b, generator=g) < 0.3] = float("nan")  # one NaN entry
    x[:, :, 7][torch.rand(steps, b, generator=g) < 0.05] = float("inf")
    x[:, :, 8][torch.rand(steps, b, generator=g) < 0.03] = float("inf")
    x[(r > 0.1) & (r < 0.16)] = 0.0  # uniform rows: every probability tied
    return x


OPTIONS = [
    SamplerOptions(),
    SamplerOptions(top_k=3, top_p=0.5),
    SamplerOptions(top_k=60, top_p=1.0, win_size=3, tau_r=0.5),
    SamplerOptions(nonfinite_policy="error"),
    SamplerOptions(nonfinite_policy="legacy-zero"),
    SamplerOptions(min_len_rule="official-head", top_k=1),
]


@pytest.mark.parametrize(
    "opts", OPTIONS, ids=lambda o: f"{o.nonfinite_policy}-{o.top_k}-{o.top_p}-{o.min_len_rule}"
)
@pytest.mark.parametrize("b,seed", [(1, 0), (3, 1), (8, 2)])
def test_slot_sampler_equals_batch_sampler(opts: SamplerOptions, b: int, seed: int) -> None:
    """Rows enter at different global steps (continuous batching) and run for their own number of
    steps; each slot draws exactly what a per-call BatchSampler draws for that row alone."""
    steps = 14
    x = _logits(b, steps, seed)
    seeds = [seed * 1000 + i for i in range(b)]
    min_len = [(i * 3) % 7 for i in range(b)]
    start = [(i * 5) % 4 for i in range(b)]  # global step at which row i enters its slot
    slot = SlotSampler(opts, slots=b, vocab=V, speech_token_size=S, device="cpu")
    slot.reset(torch.arange(b), torch.tensor([stream_key(s, 1) for s in seeds]), torch.tensor(min_len))
    got: list[list[tuple[int, bool]]] = [[] for _ in range(b)]
    live_left = [steps - start[i] for i in range(b)]
    for g in range(steps + 4):
        live = torch.tensor([start[i] <= g and live_left[i] > 0 for i in range(b)])
        step = torch.tensor([max(0, g - start[i]) for i in range(b)])
        logits = torch.stack([x[min(steps - 1, max(0, g - start[i])), i] for i in range(b)])
        tok, ab = slot(logits, live, step)
        for i in range(b):
            if bool(live[i]):
                got[i].append((int(tok[i]), bool(ab[i])))
                live_left[i] = 0 if bool(ab[i]) else live_left[i] - 1  # an aborted row leaves its slot
    counters = slot.state_rows().tolist()
    for i in range(b):
        ref = BatchSampler(opts, row_ids=[f"r{i}"], row_seeds=[seeds[i]], segments=[1], min_len=[min_len[i]],
                           speech_token_size=S, device="cpu")
        want = []
        for k in range(steps - start[i]):
            t, a = ref.sample(x[k, i][None], torch.tensor([0]), k)
            want.append((int(t[0]), bool(a[0])))
            if bool(a[0]):
                break
        assert got[i] == want, i
        ref_counters = ref._counters[:, 0].tolist()
        ref_err = [
            int(ref._err_kind[0]),
            int(ref._err_step[0]),
            int(ref._err_nan[0]),
            int(ref._err_posinf[0]),
        ]
        assert counters[i] == ref_counters + ref_err, i
    # aborts were exercised
    assert any(a for row in got for _, a in row) or opts.nonfinite_policy == "legacy-zero"


@pytest.mark.parametrize("seed", range(6))
def test_topk_nucleus_equals_sorted_nucleus_with_ties(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, (16, V), generator=g).float()  # heavy ties
    x[:4] = 0.0  # all tied
    probs = torch.softmax(x, -1)
    for top_p, top_k in ((0.8, 25), (0.3, 5), (1.0, V), (0.05, 1), (0.99, 200)):
        assert torch.equal(nucleus_keep(probs, top_p, top_k), nucleus_keep_sorted(probs, top_p, top_k))


def _requests(n: int, seed: int) -> list[TalkerRequest]:
    return [replace(_req(seed * 50 + i, 2 + (i * 7 + seed) % 11, (i * 3) % 6, 2 + i % 4), row_id=f"row{i}",
                    seed=seed * 100 + i, segment=i % 2) for i in range(n)]


def _nan_hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
    out = logits.clone()
    for pos, r in enumerate(rows.tolist()):
        if (r * 7 + step * 3) % 11 == 0:
            out[pos] = float("nan")  # an all-NaN step aborts the row
        elif (r + step) % 4 == 0:
            out[pos, 3] = float("nan")
        if (r + 2 * step) % 9 == 0:
            out[pos, 11] = float("inf")
    return out


def _generate(model: object, reqs: list[TalkerRequest], opts: DecodeOptions, hook: LogitsHook | None) -> list:
    """The product's generate; with a hook, its steps see the hook's logits first (tests/host_session.py)."""
    if hook is None:
        return generate(model, reqs, opts)  # type: ignore[arg-type]
    return host_generate(model, reqs, opts, logits_hook=hook)  # type: ignore[arg-type]


def _key(res: list) -> list:
    return [(r.row_id, r.raw_tokens, r.tokens, r.stop_reason, r.diagnostics.to_dict()) for r in res]


@pytest.mark.parametrize("seed,n", [(0, 1), (1, 3), (2, 8)])
@pytest.mark.parametrize("hook", [None, _nan_hook], ids=["clean", "nan"])
def test_generate_equals_todays_loop_for_any_slot_count_and_order(seed: int, n: int, hook: object) -> None:
    model = _model()
    reqs = _requests(n, seed)
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=0.9))
    want = _key(reference_generate(model, reqs, opts, hook))  # type: ignore[arg-type]
    assert len({len(w[1]) for w in want}) > 1 or n == 1  # rows of different lengths
    for slots, sync, lagged, fused in (
        (None, 4, False, None),
        (1, 1, False, True),
        (2, 3, False, True),
        (3, 4, False, False),
        (1, 2, True, True),
        (2, 3, True, False),
        (2, None, False, None),
    ):
        how = replace(opts.mechanics, sync_every=sync, lagged_reads=lagged, fused_admission=fused)
        got = _key(_generate(model, reqs, replace(opts, slots=slots, mechanics=how), hook))  # type: ignore[arg-type]
        assert got == want, (slots, sync, lagged, fused)
    order = list(reversed(range(n)))  # another admission order: the same rows, reversed

    def reordered(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        # faults follow the row
        return _nan_hook(logits, torch.tensor([order[r] for r in rows.tolist()]), step)

    got = _key(_generate(model, [reqs[i] for i in order], replace(opts, slots=2),
                         reordered if hook is not None else None))
    assert [got[order.index(i)] for i in range(n)] == want
    if hook is not None:
        assert any(w[3] == "no_finite_logits" for w in want) or n == 1


@pytest.mark.parametrize("hook", [None, _nan_hook], ids=["clean", "nan"])
def test_newcomers_riding_in_a_running_step_get_what_a_separate_prefill_gives(
    hook: object, monkeypatch
) -> None:
    """Fused admission (the CPU default): a newcomer's prompt goes through the pass of a step whose
    other slots keep decoding. Every row gets exactly what it gets prefilled apart, and only the
    first admission (nothing running yet to share a pass with) is a separate prefill."""
    from cosyclone.talker.model import CosyVoice3LM
    from cosyclone.talker.step import SlotStep

    model = _model()
    # stop ids blocked: every row runs to its cap (20 tokens short, 60 long) unless the hook aborts it.
    # A long row holds slot 0 while short rows pass through slot 1, then a long prompt (34 cells) is
    # admitted into slot 1, whose last row grew to 24: the freed slot's own cell in that step lies
    # inside the newcomer's prompt cells, written in the same pass
    def row(kind: str, i: int) -> TalkerRequest:
        text, speech, target = (12, 20, 3) if kind == "long" else (2, 0, 1)
        return replace(_req(60 + 10 * i + len(kind), text, speech, target), row_id=f"{kind}{i}", seed=i)

    reqs = [row("long", 0), row("short", 0), row("short", 1), row("long", 1), row("long", 2), row("short", 2)]
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=0.9), slots=2, min_len_override=100)
    want = _key(reference_generate(model, reqs, opts, hook))  # type: ignore[arg-type]
    apart = replace(opts, mechanics=replace(opts.mechanics, fused_admission=False))
    assert _key(_generate(model, reqs, apart, hook)) == want  # type: ignore[arg-type]
    seen = {"apart": 0, "riding": 0}
    real_admit, real_step = SlotStep.admit, CosyVoice3LM.step

    def admit(self, slots, *args, **kw):
        seen["apart"] += len(slots)
        return real_admit(self, slots, *args, **kw)

    def step(self, *args, admit=None, **kw):
        seen["riding"] += 0 if admit is None else int(admit[2].numel())
        return real_step(self, *args, admit=admit, **kw)

    monkeypatch.setattr(SlotStep, "admit", admit)
    monkeypatch.setattr(CosyVoice3LM, "step", step)
    assert _key(_generate(model, reqs, opts, hook)) == want  # type: ignore[arg-type]  # default on CPU: fused
    assert seen["riding"] >= 1 and seen["apart"] + seen["riding"] == len(reqs)
    if hook is None:  # only the first two (nothing running yet) were prefilled apart
        assert seen == {"apart": 2, "riding": 4}


def test_max_len_zero_rows_never_take_a_slot() -> None:
    model = _model()
    reqs = _requests(3, 4)
    opts = DecodeOptions(sampler=SamplerOptions(), max_len_override=0)
    res = generate(model, reqs, replace(opts, slots=2))
    assert _key(res) == _key(reference_generate(model, reqs, opts))
    assert all(r.raw_tokens == [] and r.stop_reason == "max_len" and diag(r).steps == 0 for r in res)


@pytest.mark.parametrize("slots,chunk", [(1, 1), (2, 3), (3, 2)])
@pytest.mark.parametrize("hook", [None, _nan_hook], ids=["clean", "nan"])
def test_a_session_fed_while_it_decodes_equals_todays_loop(slots: int, chunk: int, hook: object) -> None:
    """Requests join a running session a few at a time, longest last (so its cache and token buffers
    grow mid-decode, with rows running): every request gets what today's loop gives it alone."""
    from cosyclone.talker import TalkerSession

    model = _model()
    reqs = sorted(_requests(9, 3), key=lambda r: prompt_length(r) + 20 * r.target_len)
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=0.9), mechanics=StepMechanics(kv_bucket=8))
    want = _key(reference_generate(model, reqs, opts, hook))  # type: ignore[arg-type]
    session_opts = replace(opts, mechanics=replace(opts.mechanics, lagged_reads=slots == 2))
    session = (TalkerSession(model, session_opts, slots=slots) if hook is None
               else HostSession(model, session_opts, slots=slots, logits_hook=hook))  # type: ignore[arg-type]
    grown: list[int] = []
    real_grow = session.runner.engine.grow

    def grow(capacity: int, token_capacity: int) -> bool:
        grown.append(capacity)
        return real_grow(capacity, token_capacity)

    session.runner.engine.grow = grow  # type: ignore[method-assign]
    got: dict[int, object] = {}
    fed = 0
    while fed < len(reqs) or not session.idle:
        if fed < len(reqs) and session.waiting < slots:
            tickets = session.add(reqs[fed:fed + chunk])
            assert tickets == list(range(fed, min(len(reqs), fed + chunk)))
            fed += len(tickets)
        got.update(session.poll())
    session.close()
    assert _key([got[t] for t in range(len(reqs))]) == want
    assert len(grown) >= 2 and grown == sorted(grown)  # it grew while rows were running


def test_a_fixed_capacity_below_a_row_is_refused() -> None:
    model = _model()
    with pytest.raises(ValueError, match="capacity 10 is below"):
        generate(model, _requests(2, 0), DecodeOptions(mechanics=StepMechanics(capacity=10)))


def test_a_decode_on_the_same_model_meanwhile_leaves_an_open_session_intact() -> None:
    """A run's session stays open while a row is retried alone (generate) on the same model: each
    decode has its own cache cells, so both get exactly what they get alone."""
    from cosyclone.talker import TalkerSession

    model = _model()
    reqs, other = _requests(5, 6), _requests(3, 7)
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=0.9))
    want, want_other = (
        _key(reference_generate(model, reqs, opts)),
        _key(reference_generate(model, other, opts)),
    )
    session = TalkerSession(model, opts, slots=2)
    session.add(reqs)
    got = dict(session.poll())
    assert _key(generate(model, other, opts)) == want_other
    got.update(session.drain())
    session.close()
    assert _key([got[t] for t in range(len(reqs))]) == want
