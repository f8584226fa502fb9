"""Batched decoding: batch-vs-single equality, stopping, compaction, silent filter, hooks."""

from __future__ import annotations

import torch

from cosyclone.model.checkpoint import init_dummy
from cosyclone.model.config import QwenGeometry, TalkerConfig
from cosyclone.talker import DecodeOptions, TalkerRequest, generate, silent_filter
from cosyclone.talker.model import CosyVoice3LM
from tests.host_session import host_generate
from tests.samplers import ForcedSampler, GreedySampler

CFG = TalkerConfig(qwen=QwenGeometry(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=48, vocab_size=64),
                   llm_input_size=32, llm_output_size=32, speech_token_size=40)


def _model() -> CosyVoice3LM:
    return init_dummy(CosyVoice3LM(CFG).eval(), seed=5, std=0.3)


def _req(i: int, text_len: int, prompt_len: int, target_len: int) -> TalkerRequest:
    g = torch.Generator().manual_seed(i)
    return TalkerRequest(row_id=f"r{i}", text_ids=torch.randint(0, 64, (text_len,), generator=g),
                         target_len=target_len,
                         prompt_speech_tokens=torch.randint(0, 40, (prompt_len,), generator=g), seed=0)


def _greedy(model: CosyVoice3LM, reqs: list[TalkerRequest], **kw: object) -> tuple[list, list]:
    seen: list[tuple[list[int], int, torch.Tensor]] = []

    def hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        seen.append((rows.tolist(), step, logits.clone()))
        return logits

    sampler = GreedySampler([int(2 * r.target_len) for r in reqs], CFG.speech_token_size)
    res = host_generate(model, reqs, DecodeOptions(**kw), sampler=sampler, logits_hook=hook)  # type: ignore[arg-type]
    return res, seen


def _per_row_logits(seen: list, row: int) -> list[torch.Tensor]:
    return [lg[rows.index(row)] for rows, _, lg in seen if row in rows]


def test_batch_equals_single_with_very_different_lengths() -> None:
    model = _model()
    reqs = [_req(0, 2, 0, 3), _req(1, 30, 8, 2), _req(2, 10, 5, 1)]  # prompts of 4, 40 and 17
    batch, seen_b = _greedy(model, reqs)
    for i, req in enumerate(reqs):
        (single,), seen_s = _greedy(model, [req])
        assert batch[i].raw_tokens == single.raw_tokens and batch[i].stop_reason == single.stop_reason
        a, b = _per_row_logits(seen_b, i), _per_row_logits(seen_s, 0)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=0)
    assert len({len(r.raw_tokens) for r in batch}) == 3  # rows leave the batch at different steps
    assert all(r.min_len <= len(r.raw_tokens) <= r.max_len for r in batch)


def test_forced_stop_and_compaction() -> None:
    """Rows stop on any id >= S (not emitted); finished rows are no longer sampled."""
    model = _model()
    reqs = [_req(i, 3 + i, 2, 10) for i in range(4)]
    S = CFG.speech_token_size
    forced = [[3, 4, S + 7], [5, 6, 7, 8, 9, 10, 11], [1], [2, 2, 2, 2]]
    sampler = ForcedSampler(forced, stop_token=S + 1)
    res = host_generate(model, reqs, DecodeOptions(), sampler=sampler)
    assert [r.raw_tokens for r in res] == [[3, 4], [5, 6, 7, 8, 9, 10, 11], [1], [2, 2, 2, 2]]
    assert [r.stop_reason for r in res] == ["eos"] * 4
    for rows, step in sampler.calls:
        for r in rows:
            assert step <= len(forced[r])  # never sampled after its stop
    assert sampler.calls[-1][0] == [1]


def test_max_len_override_and_hook_fault() -> None:
    model = _model()
    reqs = [_req(0, 4, 3, 5), _req(1, 6, 0, 5)]
    res, _ = _greedy(model, reqs, max_len_override=3)
    assert all(len(r.raw_tokens) <= 3 for r in res)

    def force_stop(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        out = torch.full_like(logits, -1e9)
        out[:, 0] = 0.0
        out[rows == 1, CFG.eos] = 1.0  # row 1 wants to stop at once (min_len blocks it)
        return out

    sampler = GreedySampler([0, 0], CFG.speech_token_size)
    res = host_generate(
        model, reqs, DecodeOptions(max_len_override=4), sampler=sampler, logits_hook=force_stop
    )
    assert res[0].raw_tokens == [0, 0, 0, 0] and res[0].stop_reason == "max_len"
    assert res[1].raw_tokens == [] and res[1].stop_reason == "eos"


def test_silent_filter_reference_example() -> None:
    generated = [7, 1, 1, 2, 28, 29, 55, 248, 494, 9, 2241, 2242, 2322, 2323, 1, 2, 28, 40]
    kept = [7, 1, 1, 2, 28, 29, 9, 2241, 2242, 2322, 2323, 1, 40]
    assert silent_filter(generated) == kept


def test_generate_keeps_the_raw_tokens_beside_the_silent_filtered_ones() -> None:
    model = _model()
    forced = [[1] * 8 + [3, 2]]
    sampler = ForcedSampler(forced, stop_token=CFG.eos)
    (res,) = host_generate(model, [_req(0, 3, 1, 10)], DecodeOptions(), sampler=sampler)
    assert res.raw_tokens == forced[0] and res.tokens == [1] * 5 + [3, 2]


def test_default_ras_sampler_runs() -> None:
    model = _model()
    res = generate(model, [_req(0, 3, 2, 2), _req(1, 5, 0, 2)], DecodeOptions(max_len_override=6))
    assert all(len(r.raw_tokens) <= 6 and r.stop_reason in ("eos", "max_len") for r in res)
    assert all(r.diagnostics is not None for r in res)


def test_legacy_multinomial_rows_get_what_they_get_alone() -> None:
    """The LEGACY draw through a session: each row's generator is its own (seeded from its seed,
    or its segment's stream key), so a row decoded beside others, in any slot, gets its tokens alone."""
    from dataclasses import replace

    from cosyclone.talker.sampler import SamplerOptions

    model = _model()
    reqs = [replace(_req(i, 3 + 2 * i, i % 3, 3), seed=40 + i, segment=i % 2) for i in range(4)]
    opts = DecodeOptions(sampler=SamplerOptions(draw="legacy-multinomial"), max_len_override=12)
    together = generate(model, reqs, replace(opts, slots=2))
    for req, res in zip(reqs, together, strict=True):
        (alone,) = generate(model, [req], opts)
        assert res.raw_tokens == alone.raw_tokens and res.stop_reason == alone.stop_reason
        assert res.diagnostics is not None and res.diagnostics.draw == "legacy-multinomial"
    assert len({tuple(r.raw_tokens) for r in together}) == len(reqs)  # the rows draw different streams
