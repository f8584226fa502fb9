"""Rows far outside the folder's own distribution, found without ASR, and their redo manifest.

A row that babbles to the token cap has far more speech tokens per text token, and far fewer
characters per second of audio, than its neighbours; a row cut short has the opposite. Both show
against the folder's own figures, whatever the language or voice: a measure's value outside the
interquartile fences of the folder's ok rows (:mod:`cosyclone.base.fences`, the rule ``cosyclone
eval`` flags speaking rates with) flags the row.

The redo manifest is the one ``cosyclone eval`` writes (:mod:`cosyclone.eval.redo`): each flagged
row's manifest fields from its record, the prompt's path absolute, the next seed of its redo chain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.base.fences import Fences, fences
from cosyclone.eval.redo import redo_seed
from cosyclone.folder.row_record import RowRecord
from cosyclone.report.figures import Figures, FloatArray

#: the screened measures: (Figures attribute, label, what a high value means, what a low value means)
MEASURES: tuple[tuple[str, str, str, str], ...] = (
    ("chars_per_s", "characters per second", "fast: speech cut short?", "slow: babble or long pauses?"),
    (
        "tokens_per_text_token",
        "speech tokens per text token",
        "many tokens: babble to the cap?",
        "few tokens: speech cut short?",
    ),
)


@dataclass(frozen=True)
class Outlier:
    """One flagged row under one measure."""

    index: int  # the row's index in Figures.records
    measure: str  # the Figures attribute
    label: str  # the measure in words
    value: float  # the row's figure
    excess: float  # how far past the nearer fence, in IQRs (negative: below the low fence)
    meaning: str  # what the direction suggests


def spread(values: FloatArray) -> Fences:
    """The fences of a measure's values (the shared rule; kept under the page's name for its callers)."""
    return fences(values)


def find_outliers(figures: Figures) -> tuple[list[Outlier], dict[str, Fences]]:
    """The flagged rows, most extreme first, and each measure's fences (for the plots' limit lines)."""
    found: list[Outlier] = []
    spreads: dict[str, Fences] = {}
    for attr, label, high, low in MEASURES:
        values: FloatArray = getattr(figures, attr)
        f = spreads[attr] = fences(values[figures.ok])
        excess = f.excess(values)
        hits = np.flatnonzero(figures.ok & f.outside(values))
        found += [
            Outlier(int(i), attr, label, float(values[i]), float(excess[i]), high if excess[i] > 0 else low)
            for i in hits
        ]
    found.sort(key=lambda o: (-abs(o.excess), figures.records[o.index].id))
    return found, spreads


def redo_line(rec: RowRecord) -> dict[str, Any]:
    """The manifest object that redoes ``rec``'s row: its fields, the prompt absolute, the next seed."""
    obj: dict[str, Any] = {
        "id": rec.id,
        "text": rec.text,
        "prompt_audio": str(Path(rec.prompt_audio).resolve()) if rec.prompt_audio else "",
        "prompt_text": rec.prompt_text,
        "mode": rec.mode,
    }
    if rec.instruct:
        obj["instruct"] = rec.instruct
    if rec.speed != 1.0:
        obj["speed"] = rec.speed
    if rec.meta is not None:  # the row's meta goes with it, as into eval's redo.jsonl: a redo keeps it
        obj["meta"] = rec.meta
    obj["seed"] = redo_seed(rec.id, rec.seed if rec.seed >= 0 else _derived_seed(rec.id))
    return obj


def _derived_seed(row_id: str) -> int:
    """The seed run seed 0 derives for a row whose record names none (as eval's redo chain starts)."""
    from cosyclone.talker.sampler import row_seed

    return int(row_seed(0, row_id))


def redo_path_for(page: Path) -> Path:
    """Where the page's redo manifest goes: beside it, ``<page stem>.redo.jsonl``."""
    return page.with_name(page.stem + ".redo.jsonl")


def redo_bytes(records: list[RowRecord]) -> bytes:
    """The redo manifest of ``records`` (each id once, in order); empty when none."""
    seen: set[str] = set()
    lines = []
    for rec in records:
        if rec.id not in seen:
            seen.add(rec.id)
            lines.append(json.dumps(redo_line(rec), ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")
