"""Skew figures of a distribution of record counts (per key or per partition). Pure.

* **share** of an item: its count over the total.
* **Gini coefficient**: 0 when every item has the same count, approaching 1 when one item
  has everything; ``G = 2·Σ i·xᵢ / (n·Σ xᵢ) - (n + 1) / n`` over the counts sorted
  ascending, i = 1..n (the standard discrete form, as numpy-free code).
* **max/mean**: the largest count over the mean count — how many times its fair share the
  heaviest item carries (1.0 = perfectly even). What a partition-skew alert looks at.
* **coefficient of variation**: population standard deviation over the mean.

The distribution job computes the key Gini in Spark (window functions, for many keys) with
the same formula; these functions are its reference and serve the small per-partition sets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def gini(counts: Iterable[int]) -> float:
    values = sorted(c for c in counts)
    if any(v < 0 for v in values):
        raise ValueError("counts must be >= 0")
    n = len(values)
    total = sum(values)
    if n == 0 or total == 0:
        return 0.0
    weighted = sum(i * v for i, v in enumerate(values, start=1))
    return 2.0 * weighted / (n * total) - (n + 1) / n


def max_over_mean(counts: Sequence[int]) -> float:
    if not counts or sum(counts) == 0:
        return 0.0
    return max(counts) / (sum(counts) / len(counts))


def coefficient_of_variation(counts: Sequence[int]) -> float:
    if not counts:
        return 0.0
    mean = sum(counts) / len(counts)
    if mean == 0:
        return 0.0
    variance = sum((c - mean) ** 2 for c in counts) / len(counts)
    return math.sqrt(variance) / mean


@dataclass(frozen=True)
class Skew:
    items: int
    total: int
    gini: float
    max_over_mean: float
    cv: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "items": self.items,
            "total": self.total,
            "gini": self.gini,
            "max_over_mean": self.max_over_mean,
            "cv": self.cv,
        }


def skew_of(counts: Mapping[Any, int]) -> Skew:
    values = list(counts.values())
    return Skew(
        items=len(values),
        total=sum(values),
        gini=gini(values),
        max_over_mean=max_over_mean(values),
        cv=coefficient_of_variation(values),
    )
