"""Checkpoint loading: a checkpoint is data, never code.

One loader serves the released ``.pt`` files and the parity vectors' ``weights.safetensors``:
:func:`read_state_file` reads either (``torch.load(weights_only=True, mmap=True)`` for ``.pt``),
:func:`load_strict` copies it into a module with a strict key match and a readable report of
missing, unexpected and mis-shaped keys, converting dtypes to the module's (run) dtype.
``load_format="dummy"`` skips all of this: :func:`init_dummy` fills parameters with random values
of a sensible scale at any size, on the target device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .errors import ModelDirError

StateDict = dict[str, torch.Tensor]
KeyAdapter = Callable[[StateDict], StateDict]


def read_state_file(path: str | Path) -> StateDict:
    """Read a ``.pt`` (weights-only, memory-mapped) or ``.safetensors`` file into a flat dict."""
    path = Path(path)
    if not path.is_file():
        raise ModelDirError(f"{path}: checkpoint file missing")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(path)))
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # pickle errors, truncated files, unsafe globals
        raise ModelDirError(f"{path}: cannot read as a weights-only checkpoint: {exc}") from exc
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelDirError(f"{path}: expected a flat mapping of parameter names to tensors")
    return dict(obj)


@dataclass
class LoadReport:
    """What a strict load found; ``ok`` is True when nothing is missing, unexpected or mis-shaped."""

    source: str
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def render(self, limit: int = 12) -> str:
        def cut(items: list[str]) -> str:
            more = f" ... and {len(items) - limit} more" if len(items) > limit else ""
            return ", ".join(items[:limit]) + more

        lines = [f"{self.source}: strict key check failed"]
        if self.missing:
            lines.append(f"  missing ({len(self.missing)}): {cut(self.missing)}")
        if self.unexpected:
            lines.append(f"  unexpected ({len(self.unexpected)}): {cut(self.unexpected)}")
        if self.mismatched:
            shown = [f"{k} file {tuple(a)} vs model {tuple(b)}" for k, a, b in self.mismatched]
            lines.append(f"  mis-shaped ({len(shown)}): {cut(shown)}")
        return "\n".join(lines)


def check_keys(module: nn.Module, state: Mapping[str, torch.Tensor], source: str,
               ignore: tuple[str, ...] = ()) -> LoadReport:
    """Compare ``state`` against ``module.state_dict()`` (persistent entries only)."""
    expected = module.state_dict()
    report = LoadReport(source=source)
    for key, tensor in state.items():
        if key in ignore:
            report.ignored.append(key)
        elif key not in expected:
            report.unexpected.append(key)
        elif tuple(tensor.shape) != tuple(expected[key].shape):
            report.mismatched.append((key, tuple(tensor.shape), tuple(expected[key].shape)))
    report.missing = [k for k in expected if k not in state and k not in ignore]
    return report


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], *, source: str,
                ignore: tuple[str, ...] = ()) -> LoadReport:
    """Strictly load ``state`` into ``module``, casting each tensor to the parameter's dtype/device.

    ``ignore`` names keys the file must be allowed to carry although the module does not use them
    (e.g. the talker's tied ``llm.model.lm_head.weight``). Raises :class:`ModelDirError` with the
    report when keys do not match.
    """
    report = check_keys(module, state, source, ignore)
    if not report.ok:
        raise ModelDirError(report.render())
    targets = module.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, dst in targets.items():
            src = state[key]
            if dst.device.type == "meta":
                raise ModelDirError(f"{source}: module is on the meta device; materialize it first")
            dst.copy_(src.to(dtype=dst.dtype))
    return report


def load_module_file(module: nn.Module, path: str | Path, *, adapter: KeyAdapter | None = None,
                     ignore: tuple[str, ...] = ()) -> LoadReport:
    """Read ``path`` (pt or safetensors), apply a key-form ``adapter``, and strict-load it."""
    state = read_state_file(path)
    if adapter is not None:
        state = adapter(state)
    return load_strict(module, state, source=str(path), ignore=ignore)


@torch.no_grad()
def init_dummy(module: nn.Module, *, seed: int = 0, std: float = 0.02) -> nn.Module:
    """Fill every parameter with seeded random values (the dummy-weights path; no file is read).

    Norm-like 1-D weights become ~1, biases ~0, matrices N(0, std); buffers are left as the
    module built them (they must already be on the module's device). Values are drawn on the CPU
    with a private generator, so the result does not depend on the device or the global RNG.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in module.named_parameters():
        shape = param.shape
        if param.dim() <= 1:
            leaf = name.rsplit(".", 1)[-1]
            base = 0.0 if leaf == "bias" else 1.0
            values = base + 0.01 * torch.randn(shape, generator=gen)
        else:
            fan_in = max(1, param[0].numel())
            scale = min(std, fan_in ** -0.5)
            values = torch.randn(shape, generator=gen) * scale
        param.copy_(values.to(dtype=param.dtype))
    return module
