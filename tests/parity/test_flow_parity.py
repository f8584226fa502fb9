"""Flow parity against the captured official calls (vectors/flow): estimator, CFM, full inference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cosyclone.base import cpu_gemm
from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
from cosyclone.code2wav.noise import flow_noise
from tests.streaming_mask import streaming_context

from .conftest import load_vector_set
from .models import small_flow
from .rounding import float32_noise

# Tolerance: ten times the set's own float32 noise (vectors.json fp64-vs-fp32 gaps, 2.2e-6 in the
# public set; BLAS kernels differ across CPUs by that order), and at least 2e-5. Measured: <= 1.7e-6.
MARGIN, FLOOR = 10.0, 2e-5
GEMMS = ["aten", "onednn"] if cpu_gemm.onednn_available() else ["aten"]


@pytest.fixture(scope="module", params=GEMMS)
def flow_set(request) -> tuple[dict[str, Any], dict[str, torch.Tensor], CausalMaskedDiffWithDiT]:
    """Every flow parity test runs on both libraries of fp32 linear layers (--cpu-gemm)."""
    meta, tensors = load_vector_set("flow")
    return meta, tensors, cpu_gemm.apply(small_flow(meta).requires_grad_(False), request.param)


@pytest.fixture(scope="module")
def atol(flow_set) -> float:
    return max(FLOOR, MARGIN * float32_noise(flow_set[0]))


def _maxabs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


def _lens(v: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    tok, pt = v["inputs.token"], v["inputs.prompt_token"]
    return tok, torch.tensor([tok.shape[1]]), pt, torch.tensor([pt.shape[1]])


def test_noise_slice(flow_set) -> None:
    _, v, _ = flow_set
    ref = v["inputs.rand_noise_slice"]
    assert torch.equal(flow_noise(ref.shape[2]), ref)


def test_estimator(flow_set, atol: float) -> None:
    _, v, model = flow_set
    with torch.inference_mode():
        out = model.decoder.estimator(v["estimator.in.x"], v["estimator.in.mask"], v["estimator.in.mu"],
                                      v["estimator.in.t"], v["estimator.in.spks"], v["estimator.in.cond"])
    assert _maxabs(out, v["estimator.streaming_False.out"]) < atol


def test_estimator_under_the_official_streaming_mask(flow_set, atol: float) -> None:
    """The product never streams, but the official streaming output checks the attention under a
    block-causal mask (one that differs per query): the test swaps it into the DiT's own context."""
    meta, v, model = flow_set
    est = model.decoder.estimator
    x, mask, t = v["estimator.in.x"], v["estimator.in.mask"], v["estimator.in.t"]
    chunk = meta["small_config"]["estimator"]["static_chunk_size"]
    with torch.inference_mode():
        ctx = streaming_context(est.context(mask), mask, chunk)
        out = est.velocity(x, v["estimator.in.mu"], v["estimator.in.spks"], v["estimator.in.cond"], ctx,
                           est.modulations(t.expand(x.shape[0])))
    assert _maxabs(out, v["estimator.streaming_True.out"]) < atol


def test_conditions(flow_set, atol: float) -> None:
    _, v, model = flow_set
    tok, tl, pt, pl = _lens(v)
    with torch.inference_mode():
        mu, mask, spks, cond, pre = model.conditions(
            tok, tl, pt, pl, v["inputs.prompt_feat"], v["inputs.embedding"]
        )
    for name, got in [("pre_lookahead_out", pre), ("decoder_mu", mu), ("decoder_mask", mask),
                      ("decoder_spks", spks), ("decoder_cond", cond)]:
        assert _maxabs(got, v[f"inference.{name}"]) < atol, name


@pytest.mark.parametrize("steps", [2, 10])
def test_decoder(flow_set, atol: float, steps: int) -> None:
    _, v, model = flow_set
    out = model.decoder(v["inference.decoder_mu"], v["inference.decoder_mask"], v["inference.decoder_spks"],
                        v["inference.decoder_cond"], n_timesteps=steps)
    assert _maxabs(out, v[f"decoder.n{steps}.out"]) < atol


def test_euler_trace(flow_set, atol: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Euler step's time, state and both CFG halves' velocities, read off the estimator's calls:
    the solver passes all step times to ``modulations`` once, then ``velocity`` gets ``[x, x]``."""
    _, v, model = flow_set
    est = model.decoder.estimator
    modulations, velocity = est.modulations, est.velocity
    times: list[torch.Tensor] = []
    trace: dict[str, list[torch.Tensor]] = {"x_in": [], "v_cond": [], "v_uncond": []}

    def traced_modulations(t: torch.Tensor) -> Any:
        times.append(t.clone())
        return modulations(t)

    def traced_velocity(x: torch.Tensor, *args: Any) -> torch.Tensor:
        out = velocity(x, *args)
        b = x.shape[0] // 2
        for name, value in (("x_in", x[:b]), ("v_cond", out[:b]), ("v_uncond", out[b:])):
            trace[name].append(value.float().clone())
        return out

    monkeypatch.setattr(est, "modulations", traced_modulations)
    monkeypatch.setattr(est, "velocity", traced_velocity)
    model.decoder(v["inference.decoder_mu"], v["inference.decoder_mask"], v["inference.decoder_spks"],
                  v["inference.decoder_cond"], n_timesteps=10)
    assert len(times) == 1 and _maxabs(times[0], v["inference.euler_t"]) < 1e-6
    for ours, ref in [
        ("x_in", "euler_x_in"),
        ("v_cond", "euler_dphi_cond"),
        ("v_uncond", "euler_dphi_uncond"),
    ]:
        assert _maxabs(torch.cat(trace[ours]), v[f"inference.{ref}"]) < atol, ours


def test_inference(flow_set, atol: float) -> None:
    _, v, model = flow_set
    tok, tl, pt, pl = _lens(v)
    mel, mel_len = model.inference(tok, tl, pt, pl, v["inputs.prompt_feat"], v["inputs.embedding"])
    assert mel.dtype == torch.float32
    assert mel_len.tolist() == [2 * tok.shape[1]]
    assert _maxabs(mel, v["inference.feat"]) < atol


def test_inference_batched_with_reference_row(flow_set, atol: float) -> None:
    """The captured row inside a batch with a much shorter row keeps its reference output."""
    _, v, model = flow_set
    tok, tl, pt, pl = _lens(v)
    feat, emb = v["inputs.prompt_feat"], v["inputs.embedding"]
    tok2 = torch.cat([tok, tok.flip(1)])
    pt2 = torch.cat([pt, pt.flip(1)])
    feat2 = torch.cat([feat, feat.flip(1)])
    mel, mel_len = model.inference(tok2, torch.tensor([tok.shape[1], 5]), pt2, torch.tensor([pt.shape[1], 3]),
                                   feat2, torch.cat([emb, -emb]))
    assert mel_len.tolist() == [2 * tok.shape[1], 10]
    assert _maxabs(mel[:1], v["inference.feat"]) < atol
    assert mel[1, :, 10:].abs().max().item() == 0.0


def test_bf16_inference_close_to_reference(flow_set) -> None:
    """``--dtype bf16`` (the fast CPU path on AMX) keeps the mel within bf16 rounding of the official one."""
    import copy

    _, v, model = flow_set
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bf16.reset_buffers()  # as build_flow does: inv_freq stays float32
    tok, tl, pt, pl = _lens(v)
    mel, _ = bf16.inference(tok, tl, pt, pl, v["inputs.prompt_feat"].to(torch.bfloat16),
                            v["inputs.embedding"].to(torch.bfloat16))
    ref = v["inference.feat"]
    err = _maxabs(mel, ref)
    assert mel.dtype == torch.float32 and err > 0  # really ran in bf16
    assert err < 0.03 * max(1.0, ref.abs().max().item()), err  # bf16: ~3 significant digits, 10 steps
