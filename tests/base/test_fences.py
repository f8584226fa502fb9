"""The one outlier rule (Tukey's IQR fences) that eval's speaking-rate flags and the report page share."""

from __future__ import annotations

import numpy as np

from cosyclone.base.fences import MIN_ROWS, fences


def test_a_value_five_times_its_neighbours_lies_past_the_high_fence() -> None:
    x = np.array([0.07, 0.072, 0.068, 0.071, 0.069, 0.07, 0.073, 0.067, 0.35])
    f = fences(x)
    low, high = f.limits()  # type: ignore[misc]
    assert f.q1 - 1.5 * f.iqr == low and f.q3 + 1.5 * f.iqr == high
    assert f.outside(x).tolist() == [False] * 8 + [True]
    assert f.excess(x)[-1] > 0 and (f.excess(x)[:-1] == 0).all()
    assert fences(1 / x).outside(1 / x)[-1] and fences(1 / x).excess(1 / x)[-1] < 0  # the fast side


def test_nothing_is_judged_without_enough_rows_or_any_spread() -> None:
    assert fences(np.full(50, 2.0)).limits() is None
    assert fences(np.array([1.0] * (MIN_ROWS - 2) + [50.0])).limits() is None
    assert not fences(np.full(50, 2.0)).outside(np.array([2.0, 9.0])).any()
    f = fences(np.array([1.0, np.nan, 1.1, 0.9, np.inf, 1.0, 1.05, 0.95, 1.0, 1.02]))
    assert f.n == 8 and f.limits() is not None  # NaN and inf are not values
    assert np.isnan(f.excess(np.array([np.nan]))[0]) and not f.outside(np.array([np.nan]))[0]


def test_a_zero_iqr_takes_the_scaled_mean_deviation_and_keeps_near_values_inside() -> None:
    x = np.array([3.0] * 40 + [3.1, 2.9, 30.0])
    f = fences(x)
    assert f.q1 == f.q3 == 3.0 and f.iqr > 0
    assert f.outside(x).tolist() == [False] * 42 + [True]
