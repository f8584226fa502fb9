"""Rows far outside the folder's own distribution, found without ASR, and their redo manifest.

A row that babbles to the token cap has far more speech tokens per text token, and far fewer
characters per second of audio, than its neighbours; a row cut short has the opposite. Both show
against the folder's own figures, whatever the language or voice: a measure's robust z-score
``0.6745 (x - median) / MAD`` (Iglewicz and Hoaglin's modified z-score) past ``Z_LIMIT`` flags the
row. The median and the MAD ignore the outliers themselves, which a mean and a standard deviation
would chase. When more than half the rows share one value (MAD 0) the mean absolute deviation,
scaled to match the MAD of a normal distribution, stands in; when that is 0 too, nothing is flagged.

The redo manifest is the one ``cosyclone eval`` writes (:mod:`cosyclone.eval.redo`): each flagged
row's manifest fields from its record, the prompt's path absolute, the next seed of its redo chain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyclone.eval.redo import redo_seed
from cosyclone.report.figures import Figures, FloatArray
from cosyclone.run.row_record import RowRecord

Z_LIMIT = 3.5  # modified z-score past which a row is an outlier (Iglewicz and Hoaglin's cut)
MIN_ROWS = 8  # fewer rows with a figure than this: no distribution to stand out from
MEAN_AD_TO_MAD = 1.2533  # mean absolute deviation -> the MAD's scale, for a normal distribution

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
class Spread:
    """A measure's centre and scale over the folder's ok rows."""

    median: float
    scale: float  # the MAD (or its stand-in); 0: no spread, nothing is flagged
    n: int  # rows with the figure

    def limits(self) -> tuple[float, float] | None:
        """The values past which a row is flagged (None: nothing is)."""
        if self.scale <= 0 or self.n < MIN_ROWS:
            return None
        half = Z_LIMIT * self.scale / 0.6745
        return self.median - half, self.median + half


@dataclass(frozen=True)
class Outlier:
    """One flagged row under one measure."""

    index: int  # the row's index in Figures.records
    measure: str  # the Figures attribute
    label: str  # the measure in words
    value: float  # the row's figure
    z: float  # its modified z-score (signed)
    meaning: str  # what the direction suggests


def spread(values: FloatArray) -> Spread:
    """Median and MAD of the finite ``values`` (mean absolute deviation scaled when the MAD is 0)."""
    x = values[np.isfinite(values)]
    if x.size == 0:
        return Spread(0.0, 0.0, 0)
    med = float(np.median(x))
    dev = np.abs(x - med)
    mad = float(np.median(dev))
    if mad <= 0:
        mad = float(dev.mean()) / MEAN_AD_TO_MAD
    return Spread(med, mad, int(x.size))


def find_outliers(figures: Figures) -> tuple[list[Outlier], dict[str, Spread]]:
    """The flagged rows, most extreme first, and each measure's spread (for the plots' limit lines)."""
    found: list[Outlier] = []
    spreads: dict[str, Spread] = {}
    for attr, label, high, low in MEASURES:
        values: FloatArray = getattr(figures, attr)
        s = spreads[attr] = spread(values)
        if s.limits() is None:
            continue
        with np.errstate(invalid="ignore"):
            z = 0.6745 * (values - s.median) / s.scale
            hits = np.flatnonzero(np.abs(z) > Z_LIMIT)
        found += [
            Outlier(int(i), attr, label, float(values[i]), float(z[i]), high if z[i] > 0 else low)
            for i in hits
        ]
    found.sort(key=lambda o: (-abs(o.z), figures.records[o.index].id))
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
