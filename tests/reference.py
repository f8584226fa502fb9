"""The one place that finds the reference material (read-only data of the official implementation).

* Vectors: ``$COSYCLONE_REFERENCE_VECTORS``, default ``<repo>/../shared/reference/vectors`` (a
  checkout in ``/work/<x>`` reads ``/work/shared/reference/vectors``; CI copies ``shared/`` beside
  its clone).
* State-dict manifests: ``$COSYCLONE_REFERENCE_STATE_DICTS``, else ``state_dicts/`` beside the
  vectors folder when it exists there, else ``<repo>/../shared/reference/state_dicts``.

A set is complete when every file that ``index.json`` lists under it, its own ``vectors.json`` and
every file that json names (``weights_file``, ``weights``, ``inputs``) exist. With
``COSYCLONE_REQUIRE_REFERENCE=1`` (``.ci/run`` sets it) a missing or incomplete set FAILS the test
that needs it, naming what is missing; without it the test is skipped with one reason shared by
every such test (pytest's ``-rs`` then prints it once) and the session header says what is missing.

Use :func:`reference_set` (or the ``reference_set`` fixture of ``tests/conftest.py``):
``folder = reference_set("text")``; :func:`load_vector_set` also reads the json and tensors;
:func:`reference_tokenizer` gives ``tokenizer/qwen2`` beside the vectors.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

ENV_VECTORS = "COSYCLONE_REFERENCE_VECTORS"
ENV_STATE_DICTS = "COSYCLONE_REFERENCE_STATE_DICTS"
ENV_REQUIRE = "COSYCLONE_REQUIRE_REFERENCE"
REPO = Path(__file__).resolve().parents[1]
STATE_DICT_FILES = ("llm.json", "flow.json", "hift.json", "summary.json")


def vectors_dir() -> Path:
    """Where the vector sets are expected (the folder may not exist)."""
    env = os.environ.get(ENV_VECTORS)
    if env:
        return Path(env).expanduser().resolve()
    return (REPO / ".." / "shared" / "reference" / "vectors").resolve()


def state_dicts_dir() -> Path:
    """Where the released-size state-dict manifests are expected (the folder may not exist)."""
    env = os.environ.get(ENV_STATE_DICTS)
    if env:
        return Path(env).expanduser().resolve()
    beside = vectors_dir().parent / "state_dicts"
    if beside.is_dir():
        return beside
    return (REPO / ".." / "shared" / "reference" / "state_dicts").resolve()


def required() -> bool:
    """True when missing reference material must fail the tests (``COSYCLONE_REQUIRE_REFERENCE=1``)."""
    return os.environ.get(ENV_REQUIRE, "").strip().lower() in ("1", "true", "yes")


def _json_file_refs(meta: dict[str, Any]) -> list[str]:
    """Files (relative to the vectors root) that a set's vectors.json names."""
    refs: list[str] = []
    if isinstance(meta.get("weights_file"), str):
        refs.append(meta["weights_file"].split()[0])  # hift appends a remark after the name
    if isinstance(meta.get("weights"), list):
        refs += [w for w in meta["weights"] if isinstance(w, str)]
    if isinstance(meta.get("inputs"), str):  # token2wav: "flow/vectors.safetensors: inputs.token, ..."
        refs.append(meta["inputs"].split(":", 1)[0].strip())
    return [r for r in refs if re.fullmatch(r"[\w.\-]+(/[\w.\-]+)*", r)]


def _missing_in_set(root: Path, name: str) -> tuple[str, ...]:
    if not root.is_dir():
        return (f"{root} (no such folder)",)
    index = root / "index.json"
    if not index.is_file():
        return ("index.json",)
    try:
        listed = json.loads(index.read_text()).get("files", [])
    except (OSError, ValueError) as exc:
        return (f"index.json (unreadable: {exc})",)
    wanted = [f for f in listed if f.split("/")[0] == name]
    wanted.append(f"{name}/vectors.json")
    meta_path = root / name / "vectors.json"
    if meta_path.is_file():
        try:
            wanted += _json_file_refs(json.loads(meta_path.read_text()))
        except (OSError, ValueError) as exc:
            return (f"{name}/vectors.json (unreadable: {exc})",)
    return tuple(dict.fromkeys(f for f in wanted if not (root / f).is_file()))


def missing_in_set(name: str) -> tuple[str, ...]:
    """What the vector set ``name`` lacks (empty when complete), relative to :func:`vectors_dir`."""
    return _missing_in_set(vectors_dir(), name)


def listed_sets() -> list[str]:
    """The sets ``index.json`` lists (its top-level folders), plus ``text`` (not in its file list)."""
    index = vectors_dir() / "index.json"
    try:
        files = json.loads(index.read_text()).get("files", [])
    except (OSError, ValueError):
        files = []
    names = {f.split("/")[0] for f in files if "/" in f}
    return sorted(names | {"text"})


def missing_state_dicts() -> tuple[str, ...]:
    root = state_dicts_dir()
    if not root.is_dir():
        return (f"{root} (no such folder)",)
    return tuple(f for f in STATE_DICT_FILES if not (root / f).is_file())


def _unavailable(what: str, kind: str, root: Path, missing: tuple[str, ...]) -> None:
    """Fail (naming ``what`` and its missing files) when required, else skip with one shared reason.

    The skip reason depends only on ``kind`` and ``root``, not on the test or the set, so pytest's
    ``-rs`` summary folds every such skip into one line; the header lists the missing files.
    """
    if required():
        pytest.fail(f"{what} under {root} is incomplete ({ENV_REQUIRE}=1): missing {', '.join(missing)}",
                    pytrace=False)
    pytest.skip(f"reference {kind} not available under {root} (the session header lists what is "
                f"missing); set {ENV_VECTORS} / {ENV_STATE_DICTS}, or {ENV_REQUIRE}=1 to fail instead")


def reference_set(name: str) -> Path:
    """The folder of vector set ``name``; fails or skips (see the module docstring) if incomplete."""
    missing = missing_in_set(name)
    if missing:
        _unavailable(f"reference vector set {name!r}", "vectors", vectors_dir(), missing)
    return vectors_dir() / name


def load_vector_set(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(vectors.json, tensors of vectors.safetensors)`` of set ``name`` (tensors empty if it has none)."""
    folder = reference_set(name)
    meta = json.loads((folder / "vectors.json").read_text())
    tensors_path = folder / "vectors.safetensors"
    if not tensors_path.is_file():
        return meta, {}
    from safetensors.torch import load_file

    return meta, dict(load_file(str(tensors_path)))


def state_dict_manifest(component: str) -> list[dict[str, Any]]:
    """``state_dicts/<component>.json``: the official state_dict() keys at the released size."""
    missing = missing_state_dicts()
    if missing:
        _unavailable("reference state-dict manifests", "state-dict manifests", state_dicts_dir(), missing)
    return json.loads((state_dicts_dir() / f"{component}.json").read_text())


def state_dict_summary() -> dict[str, Any]:
    """``state_dicts/summary.json`` (counts, loader checks, noise-table digests)."""
    missing = missing_state_dicts()
    if missing:
        _unavailable("reference state-dict manifests", "state-dict manifests", state_dicts_dir(), missing)
    return json.loads((state_dicts_dir() / "summary.json").read_text())


TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def reference_tokenizer(name: str = "qwen2") -> Path:
    """``<reference>/tokenizer/<name>`` (the vocabulary the text vectors were made with), beside the
    vectors folder; fails or skips like :func:`reference_set` when a file is missing."""
    folder = vectors_dir().parent / "tokenizer" / name
    missing = tuple(f for f in TOKENIZER_FILES if not (folder / f).is_file())
    if missing:
        _unavailable(f"reference tokenizer {name!r}", "tokenizer", folder, missing)
    return folder


def header_lines() -> list[str]:
    """What the pytest session header says about the reference material (once per session)."""
    lines = []
    gaps = {name: missing_in_set(name) for name in listed_sets()}
    broken = {k: v for k, v in gaps.items() if v}
    mode = "missing material FAILS" if required() else f"missing material is skipped ({ENV_REQUIRE}=1 fails)"
    if not vectors_dir().is_dir():
        lines.append(
            f"reference vectors: {vectors_dir()} INCOMPLETE (no such folder; set {ENV_VECTORS}); {mode}"
        )
    elif not broken:
        lines.append(f"reference vectors: {vectors_dir()} (complete: {', '.join(gaps)}); {mode}")
    else:
        parts = "; ".join(f"{k}: {', '.join(v)}" for k, v in broken.items())
        lines.append(f"reference vectors: {vectors_dir()} INCOMPLETE ({parts}); {mode}")
    sd = missing_state_dicts()
    if not state_dicts_dir().is_dir():
        lines.append(
            f"reference state dicts: {state_dicts_dir()} INCOMPLETE (no such folder; set {ENV_STATE_DICTS})"
        )
    else:
        lines.append(f"reference state dicts: {state_dicts_dir()} "
                     + (f"INCOMPLETE (missing {', '.join(sd)})" if sd else "(complete)"))
    return lines
