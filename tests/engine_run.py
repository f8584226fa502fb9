"""Running rows on hand-built stages, for tests that stub a stage: the engine's own run, with each
result handed to ``submit`` as the run folder's writer would get it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cosyclone.engine import Engine, RowResult
from cosyclone.manifest import ManifestRow
from cosyclone.options import RunOptions


def run(stages: Any, rows: Sequence[ManifestRow], opts: RunOptions, submit: Callable[[RowResult], Any], *,
        prefetch: bool = True, tokens: Any = None, ops: Any = None) -> list[RowResult]:
    """Every result of the run, in the order the engine yields them (each also given to ``submit``);
    ``ops``: the stage calls that stand in for the stubbed stages (``StubOps``)."""
    out = []
    for rec in Engine(stages, opts).run(rows, prefetch=prefetch, tokens=tokens, ops=ops):
        submit(rec)
        out.append(rec)
    return out
