"""Which library runs the models' fp32 linear layers on CPU: oneDNN or aten's default (MKL).

Why: on CPU the flow's DiT spends about 85% of a run in fp32 linear layers and the talker's
decode step is one skinny matmul per weight (a few rows against 0.5 B parameters). torch's CPU
``F.linear`` goes to MKL's sgemm, which on these shapes is the slower of the two libraries torch
ships: on a 2-core AMD EPYC Zen 4 MKL runs a decode step's (8 x 896) x (896 x 4864) matmul on one thread at
about 35 GFLOP/s where oneDNN reaches about 58 on two, and the DiT's (700 x 1024) x (1024 x 3072) at 140-160
GFLOP/s where oneDNN reaches about 180, with the weight as it is (``benchmarks/bench_engine.py`` measures both
on the flow's own calls). oneDNN is also the more batch-invariant of the two: a row's output bits do not
depend on how many rows share the call from two rows up (MKL's change below four rows).

``--cpu-gemm onednn`` (the default on CPU builds with oneDNN, "auto") swaps every ``nn.Linear`` of
the talker and the flow for :class:`OneDNNLinear`, whose CPU fp32 forward calls oneDNN's matmul
with the module's own weight (no repacked copy: no extra memory, nothing to refresh when weights
load). State dicts, parameter names and every other device are untouched. Results differ from
aten's by fp32 rounding (about 1e-6 relative), so the choice is part of a row's fingerprint
(``RunOptions.cpu_gemm``): a run folder made with one library redoes its rows under the other.

bf16: aten's CPU ``F.linear`` already multiplies bf16 on oneDNN, but as ``addmm``: it first copies
the bias into every output row and then accumulates into it, and a GELU after it is one more pass
over the output. On the flow's DiT shapes in bf16 (2-core AMD EPYC Zen 4, AVX512-BF16, no AMX)
the bias in oneDNN's epilogue saved 3-4% of a (700 x 1024) x (1024 x N) product and the fused GELU
14% of the up-projection on one thread (CPU time); on two threads of a loaded machine the
separate passes cost up to 2x. So a module may opt in (``bf16=True``; the flow does, the talker's
skinny decode products are left as they were) to run bf16 layers through the same oneDNN call as
fp32 ones, bias and GELU fused, wherever torch reports oneDNN bf16 support (AVX512-BF16 or AMX on
x86; nothing here assumes either: oneDNN picks its kernel for the CPU it runs on). fp32 layers
are untouched by it.
"""

from __future__ import annotations

from functools import cache
from typing import TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyclone.errors import CosycloneError

#: ``--cpu-gemm`` words; "auto" resolves to "onednn" on CPU where torch has it, else "aten".
CPU_GEMMS = ("auto", "onednn", "aten")


def onednn_available() -> bool:
    """Whether this torch build can run a linear layer through oneDNN on CPU."""
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return bool(available and torch.backends.mkldnn.enabled
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def resolve_cpu_gemm(word: str, device: torch.device) -> str:
    """The library that runs fp32 linear layers: "onednn" or "aten" (always "aten" off CPU)."""
    word = word.lower()
    if word not in CPU_GEMMS:
        raise CosycloneError(f"--cpu-gemm must be one of {', '.join(CPU_GEMMS)}, not {word!r}")
    if device.type != "cpu":
        return "aten"
    if word == "onednn" and not onednn_available():
        raise CosycloneError(f"--cpu-gemm onednn requested but this torch build ({torch.__version__}) has no "
                             "oneDNN (torch.backends.mkldnn); use --cpu-gemm aten")
    if word == "auto":
        return "onednn" if onednn_available() else "aten"
    return word


@cache
def onednn_bf16_available() -> bool:
    """Whether oneDNN multiplies bf16 on this CPU (its own check: AVX512 with bf16 or AMX on x86)."""
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gelu_tanh: bool = False,
           bf16: bool = False) -> Tensor:
    """``F.linear`` (..., in) -> (..., out), through oneDNN when every operand is fp32 on CPU (or,
    with ``bf16``, every operand bf16 on a CPU where oneDNN has bf16) and no gradient is wanted;
    ``gelu_tanh``: followed by ``GELU(approximate="tanh")``, which oneDNN
    applies to each output tile while it is still in cache (the DiT's up-projections: one pass
    over a (B, T, 2D) activation less per block, about 3% of the flow on 2 cores).

    Anything else takes ``F.linear``: another dtype or device, a graph being traced by
    ``torch.compile`` (which keeps its own choice of kernels), and a call that autograd records
    (oneDNN's op has no backward: its gradients would silently be missing).
    """
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    dtype = x.dtype
    usable = dtype == torch.float32 or (bf16 and dtype == torch.bfloat16 and onednn_bf16_available())
    if (usable and x.device.type == "cpu" and weight.dtype == dtype and (bias is None or bias.dtype == dtype)
            and weight.device.type == "cpu" and not wants_grad and not torch.compiler.is_compiling()):
        attr, algorithm = ("gelu", "tanh") if gelu_tanh else ("none", "")
        return cast(Tensor, torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm))
    y = F.linear(x, weight, bias)
    return F.gelu(y, approximate="tanh") if gelu_tanh else y


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state dict) whose CPU fp32 forward runs on oneDNN."""

    #: also bf16 forwards on oneDNN (:class:`OneDNNLinearBF16`)
    onednn_bf16 = False

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - nn.Linear's own argument name
        return linear(input, self.weight, self.bias, bf16=self.onednn_bf16)


class OneDNNLinearBF16(OneDNNLinear):
    """:class:`OneDNNLinear` whose bf16 forward runs on oneDNN too (bias and GELU in its epilogue)."""

    onednn_bf16 = True


def linear_gelu_tanh(layer: nn.Linear, x: Tensor) -> Tensor:
    """``GELU_tanh(layer(x))`` on the library ``layer`` runs on: fused into oneDNN's matmul for a
    :class:`OneDNNLinear`, else the layer, then GELU in place on its fresh output (no second buffer)."""
    if isinstance(layer, OneDNNLinear):
        return linear(x, layer.weight, layer.bias, gelu_tanh=True, bf16=layer.onednn_bf16)
    return cast(Tensor, torch.ops.aten.gelu_(layer(x), approximate="tanh"))


def use_onednn(module: nn.Module, *, bf16: bool = False) -> int:
    """Run every plain ``nn.Linear`` inside ``module`` through oneDNN (``bf16``: in bf16 too, where
    oneDNN has it); returns how many.

    The instances keep their parameters and hooks; only their class changes (to a subclass of
    ``nn.Linear``, so ``isinstance`` checks and loaders see the same module).
    """
    cls = OneDNNLinearBF16 if bf16 else OneDNNLinear
    n = 0
    for sub in module.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = cls
            n += 1
    return n


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def apply(module: ModuleT, cpu_gemm: str, *, bf16: bool = False) -> ModuleT:
    """``module`` with its linear layers on the resolved library (:func:`resolve_cpu_gemm`);
    ``bf16``: its bf16 linear layers on oneDNN too when that library is oneDNN."""
    if cpu_gemm == "onednn":
        use_onednn(module, bf16=bf16)
    return module
