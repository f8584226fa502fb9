"""The talker's numbers mean what they say: the seed a row was given, one noise stream per text
segment, raw logits under the non-finite policy, and an fp32 speech-token head in every dtype."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from cosyclone.base.device import DevicePolicy
from cosyclone.engine.tiny import TinySizes, write_tiny_config
from cosyclone.model.config import load_model_config, released_config
from cosyclone.talker import DecodeOptions, TalkerRequest, generate
from cosyclone.talker.model import build_talker
from cosyclone.talker.sampler import SamplerOptions
from tests.samplers import diag
from tests.talker.test_talker_decode import _model, _req


def _segment(req: TalkerRequest, *, row_id: str, seed: int, segment: int) -> TalkerRequest:
    return replace(req, row_id=row_id, seed=seed, segment=segment)


def test_segments_report_the_row_seed_and_batch_exactly() -> None:
    """Two segments of one row and a second row: the sampler entries carry the row's own seed and
    each segment's index, and every segment decodes the same in the batch as alone."""
    model = _model()
    reqs = [_segment(_req(0, 6, 3, 4), row_id="a", seed=123, segment=0),
            _segment(_req(1, 9, 3, 4), row_id="a", seed=123, segment=1),
            _segment(_req(2, 4, 0, 4), row_id="b", seed=2**40 + 3, segment=0)]
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=1.0), max_len_override=8)
    together = generate(model, reqs, opts)
    assert [(diag(r).seed, diag(r).segment) for r in together] == [(123, 0), (123, 1), (2**40 + 3, 0)]
    for req, res in zip(reqs, together, strict=True):
        (alone,) = generate(model, [req], opts)
        assert alone.raw_tokens == res.raw_tokens and alone.stop_reason == res.stop_reason, req.segment
        assert diag(alone).to_dict() == diag(res).to_dict()


def test_same_text_in_two_segments_gets_different_draws() -> None:
    """Step k of segment 1 no longer reuses segment 0's random numbers."""
    model = _model()
    req = _req(0, 6, 3, 20)
    opts = DecodeOptions(sampler=SamplerOptions(top_k=40, top_p=1.0, win_size=1, tau_r=100.0),
                         max_len_override=30, min_len_override=30)
    a, b = generate(model, [_segment(req, row_id="a", seed=5, segment=0),
                            _segment(req, row_id="a", seed=5, segment=1)], opts)
    assert len(a.raw_tokens) == len(b.raw_tokens) == 30
    assert a.raw_tokens != b.raw_tokens


def test_one_nan_row_of_the_speech_token_head_is_excluded_not_fatal() -> None:
    """A corrupted llm_decoder row makes one logit NaN at every step. The policy acts on the raw
    logits, so the rows still sample (never that id) and each step is counted as a NaN step; a
    log-softmax in front of it would have turned every row entirely NaN and aborted them."""
    model = _model()
    bad = 7
    with torch.no_grad():
        model.llm_decoder.weight[bad] = float("nan")
    reqs = [_req(i, 3 + 2 * i, i, 5) for i in range(3)]
    res = generate(
        model, reqs, DecodeOptions(sampler=SamplerOptions(), max_len_override=6, min_len_override=6)
    )
    for r in res:
        d = diag(r)
        assert r.stop_reason == "max_len" and len(r.raw_tokens) == 6, r.stop_reason
        assert bad not in r.raw_tokens
        assert d.nan_steps == d.steps == 6 and d.all_nan_steps == 0 and d.no_finite_steps == 0
        assert not d.aborted
    embeds, lengths = torch.randn(2, 5, model.cfg.llm_input_size), torch.tensor([5, 3])
    model.setup_cache(2, 8)
    logits = model.prefill(embeds, lengths)
    model.clear_cache()
    assert torch.isnan(logits).sum(1).tolist() == [1, 1] and torch.isnan(logits[:, bad]).all()


def test_error_policy_stops_at_the_nan_logit_of_a_corrupted_head() -> None:
    model = _model()
    with torch.no_grad():
        model.llm_decoder.weight[3] = float("nan")
    (r,) = generate(
        model, [_req(0, 4, 2, 5)], DecodeOptions(sampler=SamplerOptions(nonfinite_policy="error"))
    )
    assert r.stop_reason == "error" and diag(r).nan_steps == 1 and "1 NaN" in str(diag(r).error)


def test_speech_token_head_is_fp32_in_bf16_and_fp16_runs(tmp_path: Path) -> None:
    """The head keeps the fp32 weights (not bf16-rounded ones) and multiplies in fp32; the backbone
    and its KV cache run in the run dtype."""
    cfg = load_model_config(
        write_tiny_config(tmp_path / "m", TinySizes(text_vocab=300, speech_token_size=60))
    )
    ref = build_talker(
        cfg, DevicePolicy(torch.device("cpu"), torch.float32, "cpu"), load_format="dummy", seed=4
    )
    for dtype in (torch.bfloat16, torch.float16):
        m = build_talker(cfg, DevicePolicy(torch.device("cpu"), dtype, "cpu"), load_format="dummy", seed=4)
        assert m.dtype == dtype and m.backbone.layers[0].mlp.down_proj.weight.dtype == dtype  # type: ignore[union-attr]
        assert m.llm_decoder.weight.dtype == torch.float32
        assert torch.equal(m.llm_decoder.weight, ref.llm_decoder.weight)  # not rounded to the run dtype
        x = torch.randn(1, 6, cfg.talker.llm_input_size, generator=torch.Generator().manual_seed(0)).to(dtype)
        hidden, logits = m(x)
        assert hidden.dtype == dtype and logits.dtype == torch.float32
        want = torch.nn.functional.linear(hidden.float(), ref.llm_decoder.weight)
        torch.testing.assert_close(logits, want, rtol=0, atol=0)
        m.setup_cache(1, 4)
        assert m.cache.k.dtype == dtype
        m.clear_cache()


def test_released_geometry_head_shape() -> None:
    """The head the dtype rule is about: 6761 x 896 in the released geometry."""
    t = released_config().talker
    assert (t.decoder_size, t.llm_output_size) == (6761, 896)
