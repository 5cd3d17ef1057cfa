"""Storm suppression: every report is published or counted exactly once, and a key never
gets more than one event per window beyond its state changes."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from services.notifier.suppression import SUMMARY_ATTRIBUTE, StormSuppressor

OPEN = common_pb2.FAULT_STATE_OPEN
RESOLVED = common_pb2.FAULT_STATE_RESOLVED


def report(key: str, state: int = OPEN) -> common_pb2.FaultEvent:
    return common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_COMMIT_FAILED,
        state=state,
        dedupe_key=key,  # type: ignore[arg-type]
    )


def run(
    reports: list[tuple[float, str, int]], window: float, tick: float = 0.5
) -> list[tuple[float, common_pb2.FaultEvent]]:
    """Reports (time, key, state) in time order; due() every ``tick`` like the notifier's
    timer; returns the published events with their time."""
    suppressor = StormSuppressor(lambda _t: window)
    published: list[tuple[float, common_pb2.FaultEvent]] = []
    next_tick = 0.0
    end = (reports[-1][0] if reports else 0.0) + 3 * window + tick
    for at, key, state in reports:
        while next_tick <= at:
            published += [(next_tick, e) for e in suppressor.due(next_tick)]
            next_tick += tick
        event = report(key, state)
        admission = suppressor.admit(event, at)
        if admission.publish:
            event.suppressed_count = admission.suppressed_count
            published.append((at, event))
    while next_tick <= end:
        published += [(next_tick, e) for e in suppressor.due(next_tick)]
        next_tick += tick
    return published


def accounted(published: list[tuple[float, common_pb2.FaultEvent]]) -> int:
    """Reports represented: each published report, plus what every event counts as
    suppressed (a summary event is a copy of a suppressed report, counted in it)."""
    reports = sum(1 for _t, e in published if SUMMARY_ATTRIBUTE not in e.attributes)
    return reports + sum(e.suppressed_count for _t, e in published)


def test_storm_of_1000_in_10_seconds() -> None:
    window = 5.0
    reports = [(i * 0.01, "COMMIT_FAILED|g|s1", OPEN) for i in range(1000)]
    published = run(reports, window)
    assert accounted(published) == 1000
    times = [t for t, _e in published]
    assert all(b - a >= window for a, b in itertools.pairwise(times)), times
    assert len(published) <= 3  # 10 s of storm: windows opening at 0, 5, 10
    assert published[0][1].suppressed_count == 0
    assert all(e.attributes[SUMMARY_ATTRIBUTE] == "true" for _t, e in published[1:])


def test_state_change_is_published_at_once_with_the_count() -> None:
    suppressor = StormSuppressor(lambda _t: 10.0)
    assert suppressor.admit(report("k"), 0.0).publish
    assert not suppressor.admit(report("k"), 1.0).publish
    assert not suppressor.admit(report("k"), 2.0).publish
    resolved = suppressor.admit(report("k", RESOLVED), 3.0)
    assert resolved.publish and resolved.suppressed_count == 2
    assert suppressor.due(100.0) == []


def test_zero_window_publishes_everything() -> None:
    suppressor = StormSuppressor(lambda _t: 0.0)
    assert all(suppressor.admit(report("k"), float(i)).publish for i in range(5))
    assert len(suppressor) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=0.7),  # gap to the previous report
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([OPEN, RESOLVED]),
        ),
        max_size=200,
    ),
    st.sampled_from([0.0, 1.0, 2.5]),
)
def test_every_report_is_accounted_once_and_windows_hold(
    steps: list[tuple[float, str, int]], window: float
) -> None:
    at = 0.0
    reports = []
    for gap, key, state in steps:
        at += gap
        reports.append((at, key, state))
    published = run(reports, window)
    assert accounted(published) == len(reports)
    for key in "abc":
        mine = [(t, e) for t, e in published if e.dedupe_key == key]
        for (t1, e1), (t2, e2) in itertools.pairwise(mine):
            if e1.state == e2.state:
                assert t2 - t1 >= window - 1e-9, (key, mine)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=0.7),  # gap to the previous report
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from([OPEN, RESOLVED]),
        ),
        max_size=60,
    ),
    st.sampled_from([1.0, 2.5]),
)
def test_no_summary_is_due_before_next_due_and_one_is_at_it(
    steps: list[tuple[float, str, int]], window: float
) -> None:
    """The notifier's timer sleeps until next_due() (unless a suppressed report pokes it):
    due() has nothing before it, and a summary at it."""
    suppressor = StormSuppressor(lambda _t: window)
    at = 0.0
    for gap, key, state in steps:
        at += gap
        # What the timer would run between the reports: every deadline that came.
        while suppressor.next_due() <= at:
            assert suppressor.due(suppressor.next_due())
        suppressor.admit(report(key, state), at)
        due = suppressor.next_due()
        if due != float("inf"):
            assert due > at
            assert suppressor.due((at + due) / 2) == []
            assert suppressor.due(due - 1e-6) == []
    while suppressor.next_due() != float("inf"):
        due = suppressor.next_due()
        assert [e.suppressed_count for e in suppressor.due(due)]
        assert suppressor.next_due() > due  # a summary starts a new window
