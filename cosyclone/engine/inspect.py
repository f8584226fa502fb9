"""What ``cosyclone inspect`` checks: a model directory's geometry and keys, and the install around it.

Owns the checks and their one-line verdicts; the command prints them. Each checkpoint is checked
the way its stage loads it (the same key adapter and tied keys) against modules built on the meta
device: shapes only, no memory, no random init. Must not load weights into a model or print.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cosyclone.errors import CosycloneError

TEXT_NORMALIZERS = ("wetext", "inflect")  # what the official frontend normalizes with when ttsfrd is absent
#: The modules a run imports beyond the models (a broken one must fail inspect, not a run's first row).
RUN_MODULES = ("cosyclone.frontend", "cosyclone.engine", "cosyclone.run.job", "cosyclone.folder.writer")
_IMPORT_NAMES = {"pyyaml": "yaml"}  # declared distributions whose module has another name


def declared_requirements() -> set[str]:
    """Names of the installed cosyclone distribution's required dependencies (extras excluded)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("cosyclone") or []
    except metadata.PackageNotFoundError:
        return set()
    names = set()
    for req in reqs:
        marker = req.split(";", 1)[1] if ";" in req else ""
        if "extra" in marker:  # e.g. 'pytest>=8; extra == "dev"'
            continue
        names.add(re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-"))
    return names


def module_of(dist: str) -> str:
    """The module a declared distribution is imported as (``pyyaml`` -> ``yaml``)."""
    return _IMPORT_NAMES.get(dist, dist.replace("-", "_"))


def import_status(name: str, dist: str | None = None) -> tuple[bool, str]:
    """(importable, "version x" or the import error) without letting an error escape.

    The version is the installed distribution's (``importlib.metadata``): wetext, for one, has no
    ``__version__``, and the distribution's is the one its text cache and the run record key on.
    """
    from importlib import metadata

    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # ImportError, or a broken install raising anything at import time
        return False, f"{type(exc).__name__}: {exc}"
    try:
        version = metadata.version(dist or name)
    except metadata.PackageNotFoundError:  # a module on the path without installed metadata
        version = str(getattr(mod, "__version__", "unknown"))
    return True, f"version {version}"


def geometry_lines(model_dir: Path, cfg: Any, policy: Any) -> list[str]:
    """The model's shape and the device it would run on, as ``inspect`` prints them first."""
    q = cfg.talker.qwen
    return [
        f"model dir: {model_dir} (yaml sha256 {cfg.yaml_sha256[:16]})",
        f"talker: hidden {q.hidden_size}, layers {q.num_hidden_layers}, heads {q.num_attention_heads}/"
        f"{q.num_key_value_heads}, speech tokens {cfg.talker.speech_token_size}",
        f"flow DiT: dim {cfg.flow.dit.dim}, depth {cfg.flow.dit.depth}; hift base {cfg.hift.base_channels}",
        f"device: {policy.device} ({policy.backend}, {policy.dtype}; fp32 linear layers on CPU: "
        f"{policy.cpu_gemm})",
    ]


def environment_checks() -> Iterator[tuple[str, bool]]:
    """(line, ok) for onnxruntime, the text normalizers and every other required package."""
    try:
        import onnxruntime as ort

        yield f"onnxruntime providers: {', '.join(ort.get_available_providers())}", True
    except ImportError as exc:
        yield f"onnxruntime: NOT importable ({exc})", False
    required = declared_requirements()
    for name in TEXT_NORMALIZERS:
        ok, detail = import_status(name)
        need = "required" if name in required else "optional"
        yield (f"text normalizer {name} ({need}): {'ok, ' + detail if ok else 'NOT importable: ' + detail}",
               ok or need != "required")
    # Required packages that stages import only when they run (the tokenizer's transformers,
    # safetensors, soundfile, ...): a broken one must fail here, not on the first row of a run.
    for dist in sorted(required - set(TEXT_NORMALIZERS) - {"onnxruntime"}):
        ok, detail = import_status(module_of(dist))
        if not ok:
            yield f"required package {dist}: NOT importable: {detail}", False


def stage_import_error() -> str | None:
    """Why a stage module or a module a run needs does not import (None: they all do)."""
    try:
        for stage in (
            "cosyclone.code2wav.flow",
            "cosyclone.code2wav.hift",
            "cosyclone.talker.model",
            *RUN_MODULES,
        ):
            importlib.import_module(stage)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def talker_line(model_dir: Path, llm: str) -> str:
    """Which talker file a run with ``--llm llm`` reads, and the other talker files the folder holds."""
    others = sorted(p.name for p in Path(model_dir).glob("llm*.pt") if p.name != llm)
    also = f" (also here: {', '.join(others)}; pick one with --llm)" if others else ""
    return f"talker file: {llm}{also}"


def checkpoint_checks(model_dir: Path, cfg: Any, llm: str = "llm.pt") -> Iterator[tuple[str, bool]]:
    """(line, ok) per checkpoint file: parameter count and the key check against its stage (the talker's
    is ``llm``, ``--llm``'s file: a missing one or another shape fails the check)."""
    import torch

    from cosyclone.code2wav.flow import CausalMaskedDiffWithDiT
    from cosyclone.code2wav.hift import CausalHiFTGenerator
    from cosyclone.model.checkpoint import check_keys, check_tied, read_state_file
    from cosyclone.talker.model import TIED_LM_HEAD, TIED_TO, CosyVoice3LM

    checks: tuple[tuple[str, Callable[[], Any], Any, dict[str, str]], ...] = (
        (llm, lambda: CosyVoice3LM(cfg.talker), None, {TIED_LM_HEAD: TIED_TO}),
        ("flow.pt", lambda: CausalMaskedDiffWithDiT(cfg.flow), None, {}),
        ("hift.pt", lambda: CausalHiFTGenerator(cfg.hift), CausalHiFTGenerator.adapt_keys, {}),
    )
    for name, factory, adapter, tied in checks:
        with torch.device("meta"):
            module = factory()
        n = sum(p.numel() for p in module.parameters())
        try:
            state = read_state_file(model_dir / name)
            state = adapter(state) if adapter else state
            check_tied(state, tied, name)
            rep = check_keys(module, state, name, tuple(tied))
            status = "keys ok" if rep.ok else rep.render(limit=5)
            absent = [k for k in tied if k not in state]
            if rep.ok and absent:
                status += f" (no {', '.join(absent)}: the official strict load needs it)"
            ok = rep.ok
        except CosycloneError as exc:
            status, ok = str(exc), False
        yield f"{name}: {n / 1e6:.2f} M parameters; {status}", ok
