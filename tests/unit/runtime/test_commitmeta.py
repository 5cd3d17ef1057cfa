"""Commit metadata round trip: acked offsets above the commit point survive a handoff."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.commitmeta import (
    METADATA_MAX_BYTES,
    decode,
    encode,
    expand,
    ranges_of,
)


@settings(max_examples=500, deadline=None)
@given(
    committed=st.integers(min_value=0, max_value=10**12),
    acked=st.sets(st.integers(min_value=1, max_value=400), max_size=200),
    epoch=st.integers(min_value=0, max_value=10**9),
)
def test_round_trip_keeps_every_acked_offset_that_fits(
    committed: int, acked: set[int], epoch: int
) -> None:
    absolute = {committed + a for a in acked}
    text = encode(epoch, "sidecar-1", committed, ranges_of(absolute))
    assert len(text.encode()) <= METADATA_MAX_BYTES
    meta = decode(text, committed)
    assert meta is not None and meta.epoch == epoch and meta.sidecar == "sidecar-1"
    recovered = expand(meta.acked)
    assert recovered <= absolute  # never claims an offset that was not acked
    assert recovered == absolute  # 200 ranges always fit in the limit


def test_too_many_ranges_are_trimmed_lowest_first() -> None:
    acked = set(range(1, 20_000, 2))  # 10,000 single-offset ranges: far over the limit
    text = encode(1, "s", 0, ranges_of(acked))
    assert len(text.encode()) <= METADATA_MAX_BYTES
    meta = decode(text, 0)
    assert meta is not None
    kept = expand(meta.acked)
    assert kept and kept <= acked
    assert kept == {o for o in acked if o <= max(kept)}, "the lowest ranges are the ones kept"


def test_foreign_or_old_metadata_is_ignored() -> None:
    assert decode("", 5) is None
    assert decode("not json", 5) is None
    old = decode('{"epoch":3,"sidecar":"x"}', 5)
    assert old is not None and old.acked == ()


def test_ranges_of_merges_consecutive_offsets() -> None:
    assert ranges_of([5, 3, 4, 9, 10, 12]) == [(3, 5), (9, 10), (12, 12)]
