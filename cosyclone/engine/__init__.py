"""The engine: rows in, row records out, on a model loaded once (see :mod:`.runner`).

Layers inside, each importing only those below it: ``runner`` (:class:`Engine`) -> ``scheduler``
(static / continuous) -> ``isolation`` (failures confined to rows) -> ``stages`` (frontend,
talker hand-off, code2wav) -> ``outcome`` / ``batches`` / ``setup``.
"""

from cosyclone.engine.batches import plan_batches, row_cost
from cosyclone.engine.outcome import RowResult, SegmentText
from cosyclone.engine.runner import Engine
from cosyclone.engine.setup import model_config, resolve_options

__all__ = ["Engine", "RowResult", "SegmentText", "model_config", "plan_batches", "resolve_options", "row_cost"]
