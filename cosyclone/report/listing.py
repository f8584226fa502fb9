"""The rows to listen to: the worst few by each measure, and a fixed random sample of the rest.

Why bounded: a listener hears perhaps a hundred rows in an evening; the page lists at most
``PER_REASON`` rows per reason and ``SAMPLE`` random ones, so its size (the audio rides inside)
is the same for a thousand rows or a million. The sample is drawn with a fixed seed over the ok
rows in id order, so the same folder lists the same rows every time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cosyclone.report.figures import Figures, FloatArray, IntArray
from cosyclone.report.outliers import Outlier

PER_REASON = 8  # rows listed per reason
SAMPLE = 12  # rows of the random sample
SAMPLE_SEED = 48  # the sample's seed (the same rows every time)


@dataclass(frozen=True)
class Listed:
    """A row on the page and why it is there."""

    index: int  # the row's index in Figures.records
    why: tuple[str, ...]  # every reason it is listed for, in the page's order


def _top(keys: FloatArray, candidates: npt.NDArray[np.bool_], *, lowest: bool = False) -> IntArray:
    """Up to PER_REASON candidate indices with the highest (lowest) key, ties in id order."""
    idx = np.flatnonzero(candidates)
    order = np.argsort(keys[idx] if lowest else -keys[idx], kind="stable")
    return idx[order[:PER_REASON]]


def select(figures: Figures, outliers: list[Outlier]) -> list[Listed]:
    """The listed rows: highest WER, lowest similarity, lowest DNSMOS, outliers, cut at the cap, sampler
    events, sample."""
    ok = figures.ok
    reasons: dict[int, list[str]] = {}

    def add(indices: IntArray | list[int], why: str) -> None:
        for i in indices:
            reasons.setdefault(int(i), []).append(why)

    err, sim = figures.error_rate, figures.similarity
    add(_top(err, ok & np.isfinite(err) & (err > 0)), "highest WER/CER")
    add(_top(sim, ok & np.isfinite(sim), lowest=True), "lowest speaker similarity")
    add(_top(figures.dnsmos, ok & np.isfinite(figures.dnsmos), lowest=True), "lowest DNSMOS")
    for measure in dict.fromkeys(o.measure for o in outliers):
        picked = [o for o in outliers if o.measure == measure][:PER_REASON]
        add([o.index for o in picked], f"outlier: {picked[0].label}")
    add(_top(figures.duration, ok & figures.capped), "cut at the token cap")
    events = figures.event_total
    add(_top(events.astype(np.float64), ok & (events > 0)), "sampler events")
    pool = np.flatnonzero(ok)
    if pool.size:
        rng = np.random.default_rng(SAMPLE_SEED)
        add(np.sort(rng.choice(pool, size=min(SAMPLE, pool.size), replace=False)), "random sample")
    return [Listed(i, tuple(why)) for i, why in reasons.items()]
