"""cosyclone: offline, batched voice cloning with CosyVoice3.

``from cosyclone import CosyClone`` is the Python API (:mod:`cosyclone.api`); it is imported on
first use, so ``import cosyclone`` (and ``cosyclone --version``) does not import torch.
"""

from __future__ import annotations

from typing import Any

from cosyclone.base.version import __version__

__all__ = ["CosyClone", "Result", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("CosyClone", "Result"):
        from cosyclone import api

        return getattr(api, name)
    raise AttributeError(f"module 'cosyclone' has no attribute {name!r}")
