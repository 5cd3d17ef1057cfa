"""dsctl dlq's pure parts: which offsets a command reads, and a record's origin headers."""

from __future__ import annotations

import datetime

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from services.dsctl.dlq import Range, from_times, origin_of, ranges, when_ms

MARKS = st.dictionaries(
    st.integers(0, 5),
    st.tuples(st.integers(0, 50), st.integers(0, 50)).map(lambda t: (min(t), max(t))),
    max_size=6,
)
BOUND = st.none() | st.integers(-5, 60)


@given(MARKS, st.none() | st.integers(0, 5), BOUND, BOUND)
def test_ranges_read_exactly_what_is_kept_and_asked_for(
    marks: dict[int, tuple[int, int]], partition: int | None, lo: int | None, hi: int | None
) -> None:
    got = {(r.partition, o) for r in ranges(marks, partition, lo, hi) for o in range(r.lo, r.hi)}
    expected = {
        (p, o)
        for p, (low, high) in marks.items()
        if partition in (None, p)
        for o in range(low, high)
        if (lo is None or o >= lo) and (hi is None or o < hi)
    }
    assert got == expected
    assert all(r.lo < r.hi for r in ranges(marks, partition, lo, hi))


def test_ranges_in_partition_order() -> None:
    assert ranges({1: (0, 2), 0: (3, 4)}, None, None, None) == [Range(0, 3, 4), Range(1, 0, 2)]


def test_origin_is_the_newest_dead_lettering() -> None:
    headers = [
        ("trace", b"t"),
        ("ds-dlq-previous-offset", b"3"),
        ("ds-dlq-offset", b"42"),
        ("ds-dlq-topic", b"orders"),
        ("ds-dlq-client", None),
    ]
    assert origin_of(headers) == {"offset": "42", "topic": "orders", "client": ""}
    assert origin_of(None) == {}


NOW = datetime.datetime(2026, 12, 2, 3, 0, tzinfo=datetime.UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def test_since_and_until_take_an_iso_time_or_an_age() -> None:
    assert when_ms("30m", NOW) == NOW_MS - 30 * 60_000
    assert when_ms("2h", NOW) == NOW_MS - 2 * 3_600_000
    assert when_ms("1d", NOW) == NOW_MS - 86_400_000
    assert when_ms("90s", NOW) == NOW_MS - 90_000
    assert when_ms("2026-12-02T03:00:00", NOW) == NOW_MS  # UTC unless it names a zone
    assert when_ms("2026-12-02T04:00:00+01:00", NOW) == NOW_MS
    for bad in ("yesterday", "30x", "m", ""):
        with pytest.raises(typer.BadParameter):
            when_ms(bad, NOW)


@given(MARKS, st.dictionaries(st.integers(0, 5), st.integers(-1, 60)))
def test_since_moves_each_low_mark_up_never_down_and_past_the_end_when_none(
    marks: dict[int, tuple[int, int]], found: dict[int, int]
) -> None:
    moved = from_times(marks, found)
    assert set(moved) == set(marks)
    for p, (low, high) in marks.items():
        new_low, new_high = moved[p]
        assert new_high == high and low <= new_low
        if found.get(p) == -1:
            assert new_low == high  # nothing dead-lettered that late: nothing to read
        elif p in found:
            assert new_low == max(low, found[p])
