"""Skew figures: Gini, max/mean, coefficient of variation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark.jobs.skew import coefficient_of_variation, gini, max_over_mean, skew_of


def test_known_values() -> None:
    assert gini([5, 5, 5, 5]) == pytest.approx(0.0)
    assert gini([0, 0, 0, 10]) == pytest.approx(0.75)  # (n-1)/n: one item has everything
    # One key with half of 20,000 records, 100 keys sharing the rest evenly.
    counts = [10_000] + [100] * 100
    assert gini(counts) == pytest.approx(2 * (sum(range(1, 101)) * 100 + 101 * 10_000)
                                         / (101 * 20_000) - 102 / 101)  # fmt: skip
    assert max_over_mean(counts) == pytest.approx(50.5)
    assert coefficient_of_variation([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(2 / 5)
    assert gini([]) == 0.0 and max_over_mean([]) == 0.0 and coefficient_of_variation([]) == 0.0


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=200))
def test_gini_bounds_and_invariance(counts: list[int]) -> None:
    g = gini(counts)
    n = len(counts)
    assert -1e-9 <= g <= (n - 1) / n + 1e-9
    assert gini(list(reversed(counts))) == pytest.approx(g)
    assert gini([3 * c for c in counts]) == pytest.approx(g)


def test_skew_of_mapping() -> None:
    skew = skew_of({0: 30, 1: 10, 2: 20})
    assert skew.items == 3 and skew.total == 60
    assert skew.max_over_mean == pytest.approx(1.5)
    assert skew.cv == pytest.approx(math.sqrt(200 / 3) / 20)
    with pytest.raises(ValueError):
        gini([-1, 2])
