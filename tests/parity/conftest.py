"""Shared helpers for parity tests: where the reference vectors live and how to load one set.

Others import ``VECTORS`` and ``load_vector_set`` from here, so keep the surface tiny and stable.
The vectors directory comes from ``COSYCLONE_REFERENCE_VECTORS`` (default: the shared reference
checkout next to the repo). Tests skip, rather than fail, when the vectors are absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch


def vectors_dir() -> Path:
    """Resolve the reference vectors directory (may not exist; callers decide to skip)."""
    env = os.environ.get("COSYCLONE_REFERENCE_VECTORS")
    if env:
        return Path(env).expanduser().resolve()
    return (Path(__file__).parents[2] / ".." / "shared" / "reference" / "vectors").resolve()


VECTORS: Path = vectors_dir()


def load_vector_set(name: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Load ``<VECTORS>/<name>/vectors.json`` and ``vectors.safetensors``; skip the test if absent."""
    from safetensors.torch import load_file

    base = VECTORS / name
    meta_path = base / "vectors.json"
    tensors_path = base / "vectors.safetensors"
    if not meta_path.is_file() or not tensors_path.is_file():
        pytest.skip(f"reference vectors {name!r} not found under {VECTORS}")
    meta = json.loads(meta_path.read_text())
    return meta, load_file(str(tensors_path))


@pytest.fixture(scope="session")
def reference_vectors() -> Path:
    """The vectors directory, skipping the test when it is missing."""
    if not VECTORS.is_dir():
        pytest.skip(f"reference vectors not found at {VECTORS}")
    return VECTORS
