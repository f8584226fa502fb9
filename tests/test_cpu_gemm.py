"""``--cpu-gemm``: the talker's and the flow's fp32 linear layers on oneDNN or aten (MKL) on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cosyclone import cpu_gemm
from cosyclone.code2wav.flow import build_flow
from cosyclone.config import DiTConfig, FlowConfig, ModelConfig, QwenGeometry, TalkerConfig
from cosyclone.device import resolve
from cosyclone.errors import CosycloneError
from cosyclone.talker.model import build_talker

needs_onednn = pytest.mark.skipif(not cpu_gemm.onednn_available(), reason="this torch build has no oneDNN")


def ops_called(fn) -> set[str]:
    """The aten/mkldnn ops ``fn()`` dispatches (which library a layer really used)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Spy():
        fn()
    return seen

TINY = ModelConfig(
    flow=FlowConfig(vocab_size=40, pre_lookahead_channels=16, dit=DiTConfig(dim=32, depth=2, heads=2, dim_head=16,
                                                                             ff_mult=2)),
    talker=TalkerConfig(qwen=QwenGeometry(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=48, vocab_size=100),
                        llm_input_size=32, llm_output_size=32, speech_token_size=60))


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
    for swapped, plain in ((flow_on, flow_off), (talker_on, talker_off)):
        kinds = {type(m) for m in swapped.modules() if isinstance(m, nn.Linear)}
        assert kinds == {cpu_gemm.OneDNNLinear}
        assert not any(isinstance(m, cpu_gemm.OneDNNLinear) for m in plain.modules())
        a, b = swapped.state_dict(), plain.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    h = torch.randn(3, 32)
    assert "mkldnn._linear_pointwise" in ops_called(lambda: talker_on.decoder_logits(h))
    torch.testing.assert_close(talker_on.decoder_logits(h), talker_off.decoder_logits(h), rtol=1e-5, atol=1e-5)


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
    assert ours.weight.grad is not None and torch.equal(ours.weight.grad, ref.weight.grad)
