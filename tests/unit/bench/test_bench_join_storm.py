"""bench_join_storm.py's pure parts: the longest pause between heartbeat acks, and the
quantile its figures use."""

from __future__ import annotations

import math

from tests.bench.bench_join_storm import longest_pause, quantile


def test_the_longest_pause_counts_the_window_edges() -> None:
    # Acks at 1, 2 and 6 within [0, 7]: the pause 2 -> 6 is the longest.
    assert longest_pause([1.0, 2.0, 6.0], 0.0, 7.0) == 4.0
    # Acks outside the window do not count; none inside: the whole window is a pause.
    assert longest_pause([-1.0, 9.0], 0.0, 5.0) == 5.0
    # The last ack long before the window's end: the pause runs to the end.
    assert longest_pause([0.5], 0.0, 3.5) == 3.0


def test_quantile_of_nothing_is_nan_and_of_values_a_member() -> None:
    assert math.isnan(quantile([], 0.5))
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([3.0, 1.0, 2.0], 0.99) == 3.0
