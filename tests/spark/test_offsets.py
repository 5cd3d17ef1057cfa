"""Offsets of the dataservice source: canonical JSON, admission control, range planning."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.topic_partition import TP, TopicPartition
from spark.sources import offsets as off

TPS = st.tuples(st.sampled_from(["a", "b", "orders.v1"]), st.integers(0, 40))


def test_json_is_canonical_whatever_the_insertion_order() -> None:
    forward = {("b", 10): 5, ("b", 2): 7, ("a", 1): 0}
    backward = dict(reversed(list(forward.items())))
    assert off.dumps(forward) == off.dumps(backward)
    # Topics by name, partitions by number (not as strings: "10" after "2"), string keys.
    assert off.dumps(forward) == '{"a":{"1":0},"b":{"2":7,"10":5}}'
    assert json.dumps(off.to_json(forward)) == json.dumps(off.to_json(backward))


def test_json_of_topic_partition_keys_is_the_same_bytes() -> None:
    """The offsets' keys are the shared TopicPartition type; a checkpoint written with the
    plain (topic, partition) tuples before reads back equal and writes the same bytes."""
    plain = {("b", 10): 5, ("b", 2): 7, ("a", 1): 0}
    typed = {TP(topic, partition): offset for (topic, partition), offset in plain.items()}
    assert off.dumps(typed) == off.dumps(plain) == '{"a":{"1":0},"b":{"2":7,"10":5}}'
    loaded = off.from_json(off.dumps(plain))
    assert loaded == typed and all(isinstance(tp, TopicPartition) for tp in loaded)


@given(st.dictionaries(TPS, st.integers(0, 2**62)))
def test_json_round_trips(offsets: dict[tuple[str, int], int]) -> None:
    assert off.from_json(off.to_json(offsets)) == offsets
    assert off.from_json(off.dumps(offsets)) == offsets


@pytest.mark.parametrize(
    "bad",
    [
        "[]",
        "{",
        '{"t": 3}',
        '{"t": {"x": 1}}',
        '{"t": {"-1": 1}}',
        '{"t": {"0": -1}}',
        '{"t": {"0": 1.5}}',
        '{"t": {"0": true}}',
        '{"": {"0": 1}}',
    ],
)
def test_bad_offsets_are_refused(bad: str) -> None:
    with pytest.raises(off.OffsetsError):
        off.from_json(bad)


def test_special_values_only_where_allowed() -> None:
    assert off.from_json('{"t": {"0": -2, "1": -1}}', allow_special=True) == {
        ("t", 0): off.EARLIEST,
        ("t", 1): off.LATEST,
    }
    with pytest.raises(off.OffsetsError):
        off.from_json('{"t": {"0": -2}}')
    with pytest.raises(off.OffsetsError):
        off.from_json('{"t": {"0": -3}}', allow_special=True)


@st.composite
def start_and_latest(draw: st.DrawFn) -> tuple[off.Offsets, off.Offsets]:
    tps = draw(st.lists(TPS, min_size=1, max_size=20, unique=True))
    start = {tp: draw(st.integers(0, 10_000)) for tp in tps}
    latest = {tp: start[tp] + draw(st.integers(0, 5_000)) for tp in tps}
    return start, latest


@settings(max_examples=300, deadline=None)
@given(start_and_latest(), st.integers(0, 30_000))
def test_read_limit_takes_exactly_what_is_allowed(
    case: tuple[off.Offsets, off.Offsets], limit: int
) -> None:
    start, latest = case
    end = off.limit_offsets(start, latest, limit)
    assert set(end) == set(latest)
    for tp in latest:
        assert start[tp] <= end[tp] <= latest[tp]
    available = sum(latest[tp] - start[tp] for tp in latest)
    assert sum(end[tp] - start[tp] for tp in end) == min(limit, available)


@settings(max_examples=200, deadline=None)
@given(start_and_latest(), st.integers(1, 30_000))
def test_read_limit_is_proportional(case: tuple[off.Offsets, off.Offsets], limit: int) -> None:
    """Every partition gets its proportional share rounded down or up, never more."""
    start, latest = case
    end = off.limit_offsets(start, latest, limit)
    available = sum(latest[tp] - start[tp] for tp in latest)
    if available <= limit:
        assert end == latest
        return
    for tp in latest:
        exact = limit * (latest[tp] - start[tp]) / available
        assert int(exact) <= end[tp] - start[tp] <= int(exact) + 1


def test_read_limit_is_deterministic_and_never_goes_back() -> None:
    start = {("t", 0): 100, ("t", 1): 0, ("t", 2): 50}
    latest = {("t", 0): 90, ("t", 1): 10, ("t", 2): 60}  # t[0]: an older view of the end
    assert off.limit_offsets(start, latest, 5) == off.limit_offsets(dict(start), latest, 5)
    end = off.limit_offsets(start, latest, 1000)
    assert end == {("t", 0): 100, ("t", 1): 10, ("t", 2): 60}
    with pytest.raises(off.OffsetsError):
        off.limit_offsets({("t", 0): 0}, {("t", 0): 1, ("t", 1): 1}, 5)


@settings(deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 100_000), st.integers(10, 30_000))
def test_split_range_covers_exactly_and_evenly(begin: int, size: int, most: int) -> None:
    whole = off.Range("t", 3, begin, begin + size)
    pieces = off.split_range(whole, most)
    if size == 0:
        assert pieces == []
        return
    assert pieces[0].from_offset == begin and pieces[-1].to_offset == begin + size
    for a, b in itertools.pairwise(pieces):
        assert a.to_offset == b.from_offset
    assert all(0 < p.size <= most for p in pieces)
    assert max(p.size for p in pieces) - min(p.size for p in pieces) <= 1


def test_plan_ranges_skips_empty_partitions_and_reads_new_ones_from_zero() -> None:
    start = {("t", 0): 10, ("t", 1): 20}
    end = {("t", 0): 10, ("t", 1): 25, ("t", 2): 3}
    assert off.plan_ranges(start, end, 100) == [
        off.Range("t", 1, 20, 25),
        off.Range("t", 2, 0, 3),
    ]
    merged = off.merge_new_partitions(start, end)
    assert merged == {("t", 0): 10, ("t", 1): 20, ("t", 2): 0}
