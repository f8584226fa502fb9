"""Checkpoint loading: a checkpoint is data, never code.

One loader serves the released ``.pt`` files and the parity vectors' ``weights.safetensors``:
:func:`read_state_file` reads either (``torch.load(weights_only=True, mmap=True)`` for ``.pt``),
:func:`load_strict` copies it into a module with a strict key match and a readable report of
missing, unexpected and mis-shaped keys, converting dtypes to the module's (run) dtype.
``load_format="dummy"`` skips all of this: :func:`init_dummy` fills parameters with random values
of a sensible scale at any size, on the target device.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from cosyclone.errors import ModelDirError

StateDict = dict[str, torch.Tensor]
KeyAdapter = Callable[[StateDict], StateDict]


_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def load_torch_data(path: str | Path, *, mmap: bool = True) -> object:
    """``torch.load`` with the weights-only unpickler, and errors that say what the file holds.

    The weights-only unpickler refuses every object that is not a tensor, container or number;
    cosyclone never retries without it (a checkpoint is data, and running code from a model
    directory is not an option), so a refusal names the object type the file holds and how to
    turn it into plain tensors, instead of repeating torch's advice to load it unsafely. Used for
    every ``.pt`` file cosyclone reads (the model directory's and the eval speaker encoder's).
    ``mmap`` needs the zip format of torch >= 1.6; pass False for older files.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelDirError(f"{path}: checkpoint file missing")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:  # the weights-only unpickler refused an object
        found = _REFUSED_GLOBAL.search(str(exc))
        what = f"an object of type {found.group(1)}" if found else "a pickled object that is not a tensor"
        raise ModelDirError(
            f"{path}: refused: the file holds {what}, not only tensors. Checkpoints are read as data "
            "(tensors, dicts, numbers), never as code; save the plain state dict instead "
            "(torch.save(module.state_dict(), path)) or convert it to .safetensors"
        ) from None
    except Exception as exc:  # truncated or corrupt files, wrong format
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelDirError(
            f"{path}: cannot read as a torch checkpoint ({type(exc).__name__}: {first})"
        ) from exc


def read_state_file(path: str | Path) -> StateDict:
    """Read a ``.pt`` (weights-only, memory-mapped: :func:`load_torch_data`) or ``.safetensors``
    file into a flat dict of tensors; anything else in it is named in the error."""
    path = Path(path)
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise ModelDirError(f"{path}: checkpoint file missing")
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path)))
        except Exception as exc:  # truncated or not a safetensors file
            raise ModelDirError(f"{path}: cannot read as safetensors ({type(exc).__name__}: {exc})") from exc
    obj = load_torch_data(path)
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise ModelDirError(
            f"{path}: expected a mapping of parameter names to tensors, found {type(obj).__name__}"
        )
    odd = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if odd:
        more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
        raise ModelDirError(f"{path}: not a flat state dict: entries that are not tensors: "
                            f"{', '.join(odd[:3])}{more}")
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

    @property
    def geometry_mismatch(self) -> bool:
        """True when the file was written for another geometry: a tensor of another shape, or
        numbered blocks (``layers.N.``, ``transformer_blocks.N.``) missing or unexpected."""
        numbered = re.compile(r"\.\d+\.")
        return bool(self.mismatched) or any(numbered.search(k) for k in self.missing + self.unexpected)

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


def check_tied(state: Mapping[str, torch.Tensor], tied: Mapping[str, str], source: str) -> None:
    """Each ``alias -> target`` pair of ``tied`` present in ``state`` must hold the same tensor.

    The released ``llm.pt`` stores the tied ``llm.model.lm_head.weight`` beside the embedding it
    shares storage with (the official strict load needs both keys). The module keeps one copy; a
    file where the two differ is not a tied model (the official load would end up with the
    alias's values in both places), so it is refused rather than half-used.
    """
    for alias, target in tied.items():
        if alias not in state:
            continue
        a, b = state[alias], state.get(target)
        if b is None:
            raise ModelDirError(
                f"{source}: {alias} is present but {target}, the weight it is tied to, is not"
            )
        same = a.shape == b.shape and a.dtype == b.dtype and (
            (a.data_ptr() == b.data_ptr() and a.stride() == b.stride()) or torch.equal(a, b))
        if not same:
            raise ModelDirError(
                f"{source}: {alias} differs from {target}; the model ties these weights "
                "(one tensor), so a file with two different values cannot be loaded faithfully"
            )


class CheckpointKeyError(ModelDirError):
    """A strict key check failed; ``report`` says how (missing, unexpected, mis-shaped)."""

    def __init__(self, report: LoadReport) -> None:
        super().__init__(report.render())
        self.report = report


def load_strict(module: nn.Module, state: Mapping[str, torch.Tensor], *, source: str,
                ignore: tuple[str, ...] = (), tied: Mapping[str, str] | None = None) -> LoadReport:
    """Strictly load ``state`` into ``module``, casting each tensor to the parameter's dtype/device.

    ``ignore`` names keys the file may carry although the module does not use them; ``tied``
    maps keys the file may carry as copies of another key (``alias -> target``): they are checked
    equal to the target (:func:`check_tied`) and not loaded. Raises :class:`CheckpointKeyError`
    with the report when keys do not match.
    """
    tied = dict(tied or {})
    check_tied(state, tied, source)
    report = check_keys(module, state, source, ignore + tuple(tied))
    if not report.ok:
        raise CheckpointKeyError(report)
    targets = module.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, dst in targets.items():
            src = state[key]
            if dst.device.type == "meta":
                raise ModelDirError(f"{source}: module is on the meta device; materialize it first")
            dst.copy_(src.to(dtype=dst.dtype))
    return report


def load_module_file(module: nn.Module, path: str | Path, *, adapter: KeyAdapter | None = None,
                     ignore: tuple[str, ...] = (), tied: Mapping[str, str] | None = None) -> LoadReport:
    """Read ``path`` (pt or safetensors), apply a key-form ``adapter``, and strict-load it."""
    state = read_state_file(path)
    if adapter is not None:
        state = adapter(state)
    return load_strict(module, state, source=str(path), ignore=ignore, tied=tied)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


@torch.no_grad()
def init_dummy(module: ModuleT, *, seed: int = 0, std: float = 0.02) -> ModuleT:
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
