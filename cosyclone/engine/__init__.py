"""The engine: rows in, row results out, on a model loaded once (see :mod:`.runner`).

Layers inside, each importing only those below it: ``runner`` (:class:`Engine`) -> ``schedule``
(static / continuous) -> ``isolation`` (failures confined to rows) -> ``stages`` (frontend,
talker hand-off, code2wav) -> ``outcome`` / ``batches`` / ``setup``.

The names below load on first use: reading a folder's records (``cosyclone report``, ``export``)
needs :class:`RowResult` and nothing of torch or the models.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cosyclone.engine.batches import plan_batches, row_cost
    from cosyclone.engine.outcome import RowResult, SegmentText
    from cosyclone.engine.runner import Engine
    from cosyclone.engine.setup import model_config, resolve_options

_WHERE = {"plan_batches": "batches", "row_cost": "batches", "RowResult": "outcome", "SegmentText": "outcome",
          "Engine": "runner", "model_config": "setup", "resolve_options": "setup"}
__all__ = [
    "Engine",
    "RowResult",
    "SegmentText",
    "model_config",
    "plan_batches",
    "resolve_options",
    "row_cost",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"cosyclone.engine.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cosyclone.engine' has no attribute {name!r}")
