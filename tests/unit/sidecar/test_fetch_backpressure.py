"""The fetch loop's backpressure decisions, pure (fetch_backpressure.py); how the loop
applies them is tests/unit/sidecar/test_backpressure.py."""

from __future__ import annotations

from services.consumer_sidecar.fetch_backpressure import (
    HOLD_SECONDS,
    LEASED_PARTITION_SHARE,
    RESUME_FRACTION,
    over_total,
    partition_share,
    pause_change,
    still_holding,
)


def test_a_partition_pauses_at_its_cap_and_resumes_below_its_resume_share() -> None:
    cap = 1000
    assert pause_change(paused=False, buffered=cap, cap=cap, over_total=False) is True
    assert pause_change(paused=False, buffered=cap - 1, cap=cap, over_total=False) is None
    assert pause_change(paused=True, buffered=cap - 1, cap=cap, over_total=False) is None
    below = int(cap * RESUME_FRACTION) - 1
    assert pause_change(paused=True, buffered=below, cap=cap, over_total=False) is False
    # The whole buffer over its cap: every partition pauses, none resumes.
    assert pause_change(paused=False, buffered=0, cap=cap, over_total=True) is True
    assert pause_change(paused=True, buffered=0, cap=cap, over_total=True) is None


def held(*, classic: bool, full_since: float | None, holding: bool, buffered: int = 100) -> bool:
    """A buffer of cap 120 that holds back from 100 (its prefetch below the cap)."""
    return over_total(
        classic=classic,
        buffered=buffered,
        leased_cap=120,
        hold_at=100,
        full_since=full_since,
        holding=holding,
    )


def test_leased_mode_holds_back_before_the_whole_buffer_counts_as_over() -> None:
    assert still_holding(10.0, 10.0 + HOLD_SECONDS / 2)
    assert not still_holding(10.0, 10.0 + HOLD_SECONDS)
    assert not held(classic=False, full_since=10.0, holding=True)
    assert held(classic=False, full_since=10.0, holding=False)
    assert not held(classic=False, full_since=None, holding=False)
    # kafka_group mode never holds back: over at the cap itself.
    assert not held(classic=True, full_since=None, holding=False)
    assert held(classic=True, full_since=None, holding=False, buffered=120)
    assert partition_share(classic=True) == 1
    assert partition_share(classic=False) == LEASED_PARTITION_SHARE
