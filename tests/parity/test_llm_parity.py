"""Parity of the talker against the official CosyVoice3LM reference vectors (small model).

Sizes come from the vectors' JSON (``qwen2_config``, ``cosyvoice3lm_args``); weights are read by
``checkpoint.load_module_file``, the same loader that reads ``llm.pt``. Tolerances: the reference's
own fp64-vs-fp32 gap is ~1e-6, so fp32 must agree within a few 1e-6.
"""

from __future__ import annotations

import pytest
import torch

from cosyclone.base import cpu_gemm
from cosyclone.model.config import QwenGeometry, TalkerConfig
from cosyclone.talker import DecodeOptions, TalkerRequest
from cosyclone.talker.model import CosyVoice3LM, load_talker_weights
from tests.host_session import host_generate
from tests.samplers import ForcedSampler

from .conftest import VECTORS, load_vector_set
from .rounding import float32_noise

MARGIN, FLOOR = 20.0, 2e-5  # tolerance: 20x the set's own float32 noise (fp64-vs-fp32 ~7e-7), >= 2e-5


def _talker_config(meta: dict) -> TalkerConfig:
    q = meta["qwen2_config"]
    fields = set(QwenGeometry.__dataclass_fields__)
    geometry = QwenGeometry(**{k: v for k, v in q.items() if k in fields})
    args = meta["cosyvoice3lm_args"]
    return TalkerConfig(qwen=geometry, llm_input_size=args["llm_input_size"],
                        llm_output_size=args["llm_output_size"], speech_token_size=args["speech_token_size"])


def _atol(meta: dict) -> float:
    return max(FLOOR, MARGIN * float32_noise(meta, "decode.", "forward."))


GEMMS = ["aten", "onednn"] if cpu_gemm.onednn_available() else ["aten"]


def _model(dtype: torch.dtype = torch.float32, gemm: str = "aten") -> tuple[CosyVoice3LM, dict, dict]:
    meta, vec = load_vector_set("llm")
    model = CosyVoice3LM(_talker_config(meta)).eval()
    report = load_talker_weights(model, VECTORS / meta["weights_file"])
    assert report.ok
    return cpu_gemm.apply(model.to(dtype).requires_grad_(False), gemm), meta, vec


def _request(vec: dict, meta: dict) -> TalkerRequest:
    text_ids = torch.cat([vec["inputs.prompt_text_small_vocab"][0], vec["inputs.text"][0]])
    return TalkerRequest(row_id="r0", text_ids=text_ids, target_len=int(vec["inputs.text"].shape[1]),
                         prompt_speech_tokens=vec["inputs.prompt_speech_token"][0], seed=0)


def test_derived_ids_and_lengths() -> None:
    model, meta, vec = _model()
    d = meta["derived"]
    cfg = model.cfg
    assert (cfg.sos, cfg.eos, cfg.task_id, cfg.fill, cfg.decoder_size) == (
        d["sos"], d["eos_token"], d["task_id"], d["fill_token"], d["llm_decoder_out"])
    lt = vec["inputs.text"].shape[1]
    assert int(cfg.min_len_ratio * lt) == d["min_len"] and int(cfg.max_len_ratio * lt) == d["max_len"]


@torch.no_grad()
def test_input_assembly() -> None:
    model, meta, vec = _model()
    req = _request(vec, meta)
    got = model.assemble(req.text_ids, req.prompt_speech_tokens)
    torch.testing.assert_close(got, vec["decode.lm_input"][0], atol=0, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("gemm", GEMMS)
def test_forward_logits(gemm: str) -> None:
    model, meta, vec = _model(gemm=gemm)
    atol = _atol(meta)
    hidden, logits = model(vec["forward.input_embeds"])
    torch.testing.assert_close(hidden, vec["forward.hidden"], atol=atol, rtol=0)
    torch.testing.assert_close(logits, vec["forward.logits"], atol=atol, rtol=0)
    torch.testing.assert_close(torch.log_softmax(logits, -1), vec["forward.logp"], atol=atol, rtol=0)


@pytest.mark.parametrize("gemm", GEMMS)
@torch.no_grad()
def test_forced_decode_every_step(gemm: str) -> None:
    """Every decode step's scores (prefill, then cached steps) and the yielded tokens."""
    model, meta, vec = _model(gemm=gemm)
    atol = _atol(meta)
    forced = vec["inputs.forced_tokens"].tolist()
    n_steps = meta["calls"][0]["number_of_steps"]
    seen: list[torch.Tensor] = []

    def hook(logits: torch.Tensor, rows: torch.Tensor, step: int) -> torch.Tensor:
        seen.append(logits[0].clone())
        return logits

    sampler = ForcedSampler([forced], stop_token=model.cfg.eos)
    # official-head min_len rule: index S (sos) masked while step < min_len; reproduce that mask here
    (res,) = host_generate(model, [_request(vec, meta)], DecodeOptions(), sampler=sampler,
                           logits_hook=hook)
    assert res.raw_tokens == vec["decode.yielded_tokens"].tolist() and res.stop_reason == "eos"
    assert len(seen) == n_steps
    min_len = meta["derived"]["min_len"]
    S = model.cfg.speech_token_size
    for n, got in enumerate(seen):
        ref = vec[f"decode.step{n}.logp_after_ignore_eos"]
        got = torch.log_softmax(got, -1)  # the talker hands the sampler raw logits; the capture is log-probs
        if n < min_len:
            got[S] = float("-inf")
        torch.testing.assert_close(got, ref, atol=atol, rtol=0)


@torch.no_grad()
def test_bf16_logits_close_to_fp32() -> None:
    model, _, vec = _model()
    x = vec["forward.input_embeds"]
    _, ref = model(x)
    model16 = model.to(torch.bfloat16)
    _, got = model16(x.to(torch.bfloat16))
    assert got.dtype == torch.float32  # logits leave the model in fp32
    err = (got - ref).abs().max().item()
    assert err < 0.03 * max(1.0, ref.abs().max().item()), err  # bf16: ~3 significant digits
