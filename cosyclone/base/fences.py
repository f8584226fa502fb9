"""The one outlier rule: Tukey's interquartile fences, ``Q1 - 1.5 IQR .. Q3 + 1.5 IQR``.

Why one rule in the base: ``cosyclone eval`` flags a row's speaking rate (seconds per character)
against the rows of its language, and ``report --html`` screens a folder's characters per second
and speech tokens per text token; a row must be an outlier in both or in neither. The fences are
the rule the data filters trainers use apply to duration per character (Emilia-Pipe drops rows
outside them); quartiles ignore the outliers themselves, which a mean and a standard deviation
would chase. Both sit above the base, so the rule lives here with no import of theirs.

Where more than half the values are one value (IQR 0) the mean absolute deviation from the median,
scaled to the IQR of a normal distribution, stands in (a folder of identical rows plus one five
times slower still flags that one); when that is 0 too, nothing is flagged. Fewer than
``MIN_ROWS`` values are no distribution to stand out from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

K = 1.5  # fence distance in IQRs beyond the quartiles (Tukey's)
MIN_ROWS = 8  # fewer values than this: nothing is judged
MEAN_AD_TO_IQR = 1.6906  # mean absolute deviation -> IQR, for a normal distribution (1.349 / 0.7979)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Fences:
    """A measure's quartiles over the values it was computed from, and the fences they set."""

    q1: float  # first quartile
    median: float  # the median
    q3: float  # third quartile
    iqr: float  # q3 - q1 (or its stand-in when that is 0); 0: no spread, nothing is flagged
    n: int  # finite values the quartiles were computed from

    @property
    def judged(self) -> bool:
        """Whether any value can lie outside (enough values, some spread)."""
        return self.iqr > 0 and self.n >= MIN_ROWS

    def limits(self) -> tuple[float, float] | None:
        """(low, high) past which a value is an outlier; None when nothing is judged."""
        if not self.judged:
            return None
        return self.q1 - K * self.iqr, self.q3 + K * self.iqr

    def excess(self, values: FloatArray) -> FloatArray:
        """How far each value lies past its nearer fence, in IQRs: negative below the low fence,
        positive above the high one, 0 inside (and NaN for NaN); all 0 when nothing is judged."""
        x = np.asarray(values, dtype=np.float64)
        lim = self.limits()
        if lim is None:
            return np.where(np.isfinite(x), 0.0, np.nan)
        below = np.minimum(x - lim[0], 0.0)
        above = np.maximum(x - lim[1], 0.0)
        return (below + above) / self.iqr

    def outside(self, values: FloatArray) -> npt.NDArray[np.bool_]:
        """True where a (finite) value lies outside the fences."""
        with np.errstate(invalid="ignore"):
            found: npt.NDArray[np.bool_] = np.nan_to_num(self.excess(values), nan=0.0) != 0.0
        return found


def fences(values: FloatArray) -> Fences:
    """The fences of the finite ``values``."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Fences(0.0, 0.0, 0.0, 0.0, 0)
    q1, med, q3 = (float(v) for v in np.percentile(x, (25, 50, 75)))
    iqr = q3 - q1
    if iqr <= 0:
        iqr = float(np.abs(x - med).mean()) * MEAN_AD_TO_IQR
    return Fences(q1, med, q3, iqr, int(x.size))
