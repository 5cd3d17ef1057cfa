"""dsctl dlq's pure parts: which offsets a command reads, and a record's origin headers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.dsctl.dlq import Range, origin_of, ranges

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
