"""A batch in the continuous pipeline between its frontend and code2wav: :class:`InFlight`.

Why its own module: the talker's side (:mod:`.talker_flight`), the recovery of a failed session
(:mod:`.recovery`) and code2wav (:mod:`.code2wav_worker`) all hold it, and none of them owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cosyclone.engine.outcome import Failure
from cosyclone.engine.stages import PreparedBatch
from cosyclone.manifest import ManifestRow

if TYPE_CHECKING:
    from cosyclone.talker.results import TalkerResult


@dataclass
class InFlight:
    """A batch whose segments are (partly) in the talker."""

    rows: list[ManifestRow]
    prepared: PreparedBatch | None  # None when its frontend raised outside the per-row guards (``error``)
    results: dict[int, TalkerResult] = field(default_factory=dict)  # segment index -> talker result
    todo: set[int] = field(default_factory=set)  # segment indices still in the talker
    error: Failure | None = None  # why the batch goes through every stage row by row instead
