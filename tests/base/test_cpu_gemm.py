"""``--cpu-gemm``: the talker's and the flow's fp32 linear layers on oneDNN or aten (MKL) on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import override

from cosyclone.base import cpu_gemm
from cosyclone.base.device import resolve
from cosyclone.code2wav.flow import build_flow
from cosyclone.errors import CosycloneError
from cosyclone.model.config import DiTConfig, FlowConfig, ModelConfig, QwenGeometry, TalkerConfig
from cosyclone.talker.model import build_talker

needs_onednn = pytest.mark.skipif(not cpu_gemm.onednn_available(), reason="this torch build has no oneDNN")


def ops_called(fn) -> set[str]:
    """The aten/mkldnn ops ``fn()`` dispatches (which library a layer really used)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Spy(TorchDispatchMode):
        @override
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Spy():
        fn()
    return seen

TINY = ModelConfig(
    flow=FlowConfig(
        vocab_size=40,
        pre_lookahead_channels=16,
        dit=DiTConfig(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2),
    ),
    talker=TalkerConfig(
        qwen=QwenGeometry(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            vocab_size=100,
        ),
        llm_input_size=32,
        llm_output_size=32,
        speech_token_size=60,
    ),
)


def test_words_resolve_per_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert cpu_gemm.resolve_cpu_gemm("aten", cpu) == "aten"
    assert cpu_gemm.resolve_cpu_gemm("AUTO", cpu) == ("onednn" if cpu_gemm.onednn_available() else "aten")
    assert cpu_gemm.resolve_cpu_gemm("onednn", cuda) == "aten"  # GPUs keep their own BLAS
    with pytest.raises(CosycloneError, match="--cpu-gemm must be one of auto, onednn, aten"):
        cpu_gemm.resolve_cpu_gemm("mkl", cpu)
    assert resolve("cpu", "fp32", "aten").cpu_gemm == "aten"


def test_onednn_requested_without_onednn_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_gemm, "onednn_available", lambda: False)
    with pytest.raises(CosycloneError, match="has no oneDNN"):
        resolve("cpu", "fp32", "onednn")
    assert resolve("cpu", "fp32", "auto").cpu_gemm == "aten"


@needs_onednn
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24), (0, 24), (2, 0, 24), (24,)])
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_onednn_linear_equals_aten_within_fp32_rounding(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    aten = nn.Linear(24, 40, bias=bias)
    ours = nn.Linear(24, 40, bias=bias)
    ours.load_state_dict(aten.state_dict())
    assert cpu_gemm.use_onednn(ours) == 1 and isinstance(ours, nn.Linear)
    x = torch.randn(shape)
    assert "mkldnn._linear_pointwise" in ops_called(lambda: ours(x))
    got, ref = ours(x), aten(x)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@needs_onednn
@torch.no_grad()
def test_onednn_linear_takes_strided_inputs_and_falls_back_off_fp32() -> None:
    torch.manual_seed(1)
    layer = cpu_gemm.apply(nn.Linear(16, 8), "onednn")
    x = torch.randn(2, 16, 5).transpose(1, 2)  # (2, 5, 16), not contiguous
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    half = layer.to(torch.bfloat16)
    xb = torch.randn(3, 16, dtype=torch.bfloat16)
    assert torch.equal(half(xb), F.linear(xb, half.weight, half.bias))  # bf16 takes aten's path, bit for bit


needs_onednn_bf16 = pytest.mark.skipif(not cpu_gemm.onednn_bf16_available(),
                                       reason="oneDNN has no bf16 on this CPU (or torch has no oneDNN)")


@needs_onednn_bf16
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_bf16_opt_in_runs_on_onednn_with_bias_and_gelu_fused(bias: bool, gelu: bool) -> None:
    """``bf16=True`` layers (the flow's) run bf16 through oneDNN's matmul with the bias (and GELU)
    in its epilogue: no addmm, no separate GELU, and the values of F.linear (then GELU) within
    bf16 rounding."""
    torch.manual_seed(4)
    layer = cpu_gemm.apply(nn.Linear(64, 96, bias=bias), "onednn", bf16=True).to(torch.bfloat16)
    assert isinstance(layer, cpu_gemm.OneDNNLinearBF16)
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    ref = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    ref = F.gelu(ref, approximate="tanh") if gelu else ref
    fn = (lambda: cpu_gemm.linear_gelu_tanh(layer, x)) if gelu else (lambda: layer(x))
    ops = ops_called(fn)
    assert (
        "mkldnn._linear_pointwise" in ops and not {"aten.addmm", "aten.mm", "aten.gelu", "aten.gelu_"} & ops
    )
    got = fn()
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)


@needs_onednn
@torch.no_grad()
def test_bf16_opt_in_falls_back_to_aten_where_onednn_has_no_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without oneDNN bf16 (or with mixed dtypes) the opted-in layer is F.linear, bit for bit."""
    monkeypatch.setattr(cpu_gemm, "onednn_bf16_available", lambda: False)
    layer = cpu_gemm.apply(nn.Linear(16, 8), "onednn", bf16=True).to(torch.bfloat16)
    xb = torch.randn(3, 16, dtype=torch.bfloat16)
    assert "mkldnn._linear_pointwise" not in ops_called(lambda: layer(xb))
    assert torch.equal(layer(xb), F.linear(xb, layer.weight, layer.bias))


@needs_onednn
@pytest.mark.parametrize("library", ["onednn", "aten"])
@torch.no_grad()
def test_gelu_fused_into_the_up_projection_equals_gelu_after_it(library: str) -> None:
    """The DiT's up-projection with its tanh GELU: inside oneDNN's matmul on oneDNN layers (no
    separate GELU op), the layer then GELU on aten's; either way GELU_tanh(linear(x)) up to rounding."""
    torch.manual_seed(3)
    layer = cpu_gemm.apply(nn.Linear(64, 128), library)
    x = torch.randn(2, 7, 64) * 3
    want = F.gelu(F.linear(x, layer.weight, layer.bias), approximate="tanh")
    ops = ops_called(lambda: cpu_gemm.linear_gelu_tanh(layer, x))
    assert ("gelu" in " ".join(ops)) == (library == "aten")
    torch.testing.assert_close(cpu_gemm.linear_gelu_tanh(layer, x), want, rtol=1e-5, atol=1e-5)


@needs_onednn
@torch.no_grad()
def test_a_row_gets_the_same_bits_whatever_rows_share_its_call() -> None:
    """oneDNN's kernel for a row does not depend on the row count from two rows up (batch invariance)."""
    torch.manual_seed(2)
    layer = cpu_gemm.apply(nn.Linear(96, 200, bias=False), "onednn")
    x = torch.randn(300, 96)
    whole = layer(x)
    for m in (2, 3, 8, 17, 100):
        assert torch.equal(layer(x[:m]), whole[:m]), m


@needs_onednn
def test_builders_swap_linears_and_keep_the_released_state_dict() -> None:
    on, off = resolve("cpu", "fp32", "onednn"), resolve("cpu", "fp32", "aten")
    flow_on, flow_off = build_flow(TINY, on, load_format="dummy"), build_flow(TINY, off, load_format="dummy")
    talker_on = build_talker(TINY, on, load_format="dummy", seed=3)
    talker_off = build_talker(TINY, off, load_format="dummy", seed=3)
    # the flow opts its bf16 layers in too; the talker's stay on aten in bf16
    for (swapped, plain), kind in zip(((flow_on, flow_off), (talker_on, talker_off)),
                                      (cpu_gemm.OneDNNLinearBF16, cpu_gemm.OneDNNLinear), strict=True):
        kinds = {type(m) for m in swapped.modules() if isinstance(m, nn.Linear)}
        assert kinds == {kind}
        assert not any(isinstance(m, cpu_gemm.OneDNNLinear) for m in plain.modules())
        a, b = swapped.state_dict(), plain.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    h = torch.randn(3, 32)
    assert "mkldnn._linear_pointwise" in ops_called(lambda: talker_on.decoder_logits(h))
    torch.testing.assert_close(
        talker_on.decoder_logits(h), talker_off.decoder_logits(h), rtol=1e-5, atol=1e-5
    )


@needs_onednn
def test_a_compiled_graph_traces_the_onednn_layer() -> None:
    """Under torch.compile the layer takes F.linear (traceable, fullgraph) and gives the same values."""
    layer = cpu_gemm.apply(nn.Linear(16, 8), "onednn")
    x = torch.randn(4, 16)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_call_that_autograd_records_takes_aten_and_gets_its_gradients() -> None:
    """oneDNN's op has no backward: with gradients wanted the layer must not use it."""
    torch.manual_seed(3)
    ours = cpu_gemm.apply(nn.Linear(8, 4), "onednn")
    ref = nn.Linear(8, 4)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 8)
    assert "mkldnn._linear_pointwise" not in ops_called(lambda: ours(x))
    ours(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert ours.weight.grad is not None and ref.weight.grad is not None
    assert torch.equal(ours.weight.grad, ref.weight.grad)
