"""Property tests of ``key`` ordering's look-ahead on the real partition table (issue 39):
real column chunks (offsets with gaps, keys, headers) taken by several holders, acked,
acked by range, nacked and released, rewound and fetched again, against a model of each
record's state.

After every step: no key is in flight to two holders; every record handed out has every
record of its key below it acked (or handed out before it in the same take); the commit
point never passes a record not acked (passed-over records included); the buffer's byte
and record counts are those of what is buffered and staged. After every take: a take
with nothing in flight hands something out (no deadlock), and a take that was not full
left no record behind whose key had nothing in flight (no head of line within the
look-ahead). At the end every record was delivered and the commit point is past the last
(nothing lost), whether the drain runs in ``key`` mode or after a switch to unordered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from dsclient.records.batches import Slice
from services.consumer_sidecar.acks import NO_LIMIT, Holder
from services.consumer_sidecar.ordering import Key, Ordering
from services.consumer_sidecar.partitions import (
    Partition,
    PartitionTable,
    Redelivery,
    _slice_bytes,
)
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime.topic_partition import TP
from tests.support.record_tables import table_holding

PROPERTY = settings(max_examples=150, deadline=None)
TP0 = TP("a", 0)
HOLDERS: list[Holder] = [("a", 1), ("b", 1), ("c", 1)]
BIG = 1 << 30


@dataclass
class Model:
    """The partition's records (offset → key) and each one's state: absent (never
    delivered), a holder (in flight), "due" or "acked"."""

    keys: dict[int, Key]
    state: dict[int, object] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)

    def in_flight(self) -> dict[int, Holder]:
        return {o: s for o, s in self.state.items() if isinstance(s, tuple)}  # type: ignore[misc]

    def lowest_unacked(self) -> int:
        return min((o for o in self.keys if self.state.get(o) != "acked"), default=-1)


def messages_of(keys: dict[int, Key], start: int = 0) -> list[Message]:
    return [
        Message(
            topic="a",
            partition=0,
            offset=o,
            key=k,
            value=b"v%d" % o,
            headers=[("h", b"%d" % o)] if o % 3 == 0 else None,
        )
        for o, k in sorted(keys.items())
        if o >= start
    ]


def fetch(table: PartitionTable, model: Model, start: int, pieces: int) -> None:
    """The fetch thread: append the records from ``start`` on, in ``pieces`` chunks."""
    messages = messages_of(model.keys, start)
    size = max(1, -(-len(messages) // pieces))
    for i in range(0, len(messages), size):
        (run,), _ = runs_from_messages(messages[i : i + size])
        table.append(TP0, run.chunk)


def rewind_if_asked(table: PartitionTable, model: Model) -> None:
    part = table.get(TP0)
    assert part is not None
    if part.rewinding:
        offset = table.rewind(TP0)
        assert offset is not None
        fetch(table, model, offset, 2)


def check_state(table: PartitionTable, model: Model) -> None:
    part = table.get(TP0)
    assert part is not None
    holders: dict[Key, set[Holder]] = {}
    for o, h in model.in_flight().items():
        if model.keys[o] is not None:
            holders.setdefault(model.keys[o], set()).add(h)
    assert all(len(h) == 1 for h in holders.values()), holders
    lowest = model.lowest_unacked()
    if lowest >= 0:
        assert part.acks.commit_point <= lowest, (part.acks.commit_point, lowest)
    check_bytes(table, part)


def check_bytes(table: PartitionTable, part: Partition) -> None:
    buffered = sum(c.remaining_bytes() for c in part.buffer)
    staged = sum(_slice_bytes(s) for s in part.staged)
    assert part.buffered_bytes == buffered + staged
    assert table.buffered_bytes == part.buffered_bytes
    records = sum(len(c) - c.start for c in part.buffer) + sum(len(s) for s in part.staged)
    assert part.buffered_records == records


def take(table: PartitionTable, model: Model, holder: Holder, limit: int) -> list[Slice]:
    before = model.in_flight()
    part = table.get(TP0)
    assert part is not None
    # no record due, no re-read (a re-read's skipped records count against the limit)
    fresh = not part.rewinding and not part.acks.due and part.acks.cursor == part.acks.next_offset
    got = table.take(limit, BIG, holder)
    handed = [o for s in got for o in s.offsets]
    assert handed == sorted(handed) and len(set(handed)) == len(handed)
    for s in got:
        for o in s.offsets:
            model.deliveries[o] = model.deliveries.get(o, 0) + 1
            assert s.deliveries == model.deliveries[o], (o, s.deliveries)
    for o in handed:
        assert not isinstance(model.state.get(o), tuple), f"{o} handed out while in flight"
        assert model.state.get(o) != "acked", f"{o} handed out after its ack"
        key = model.keys[o]
        if key is not None:
            for below in (b for b in model.keys if b < o and model.keys[b] == key):
                assert model.state.get(below) == "acked" or below in handed, (below, o)
        model.state[o] = holder
    if table.ordering is Ordering.KEY and fresh:
        if not before and any(model.state.get(o) != "acked" for o in model.keys):
            assert handed, "nothing in flight and nothing handed out: a deadlock"
        if len(handed) < limit:  # not full: nothing left behind but held keys
            held = {model.keys[o] for o in before}
            for o, key in model.keys.items():
                if o not in model.state:
                    assert key is not None and key in held, f"{o} ({key!r}) left behind"
    return got


ops = st.lists(
    st.tuples(
        st.sampled_from(["take", "take", "take", "ack", "ack", "span", "nack", "release"]),
        st.sampled_from(HOLDERS),
        st.integers(1, 8),
        st.integers(0, 10_000),
    ),
    min_size=3,
    max_size=50,
)
records = st.lists(
    st.tuples(
        st.sampled_from([1, 1, 1, 2]),
        st.sampled_from([None, b"k1", b"k1", b"k2", b"k2", b"k3", b"k4"]),
    ),
    min_size=4,
    max_size=30,
)


@PROPERTY
@given(records, ops, st.integers(1, 4), st.booleans())
def test_key_mode_looks_ahead_and_keeps_its_promise(
    recs: list[tuple[int, Key]],
    steps: list[tuple[str, Holder, int, int]],
    pieces: int,
    drain_unordered: bool,
) -> None:
    keys: dict[int, Key] = {}
    offset = 0
    for step, key in recs:
        keys[offset] = key
        offset += step  # some gaps (compaction, transaction markers)
    model = Model(keys)
    table = table_holding(messages_of(keys))
    table.redelivery = Redelivery(max_deliveries=NO_LIMIT)
    table.ordering = Ordering.KEY
    fetch(table, model, 0, pieces)
    part = table.get(TP0)
    assert part is not None
    for op, holder, limit, pick in steps:
        if op == "take":
            take(table, model, holder, limit)
        elif op in ("ack", "nack"):
            mine = sorted(o for o, h in model.in_flight().items() if h == holder)
            if mine:
                o = mine[pick % len(mine)]
                if op == "ack":
                    table.ack(part, o, holder[0])
                    model.state[o] = "acked"
                else:
                    table.nack(part, o, o + 1, holder[0], 0.0)
                    model.state[o] = "due"
        elif op == "span":  # an ack range over whatever lies there (passed over: skipped)
            delivered = sorted(o for o in model.state if model.state[o] != "acked")
            if delivered:
                lo = delivered[pick % len(delivered)]
                hi = min(lo + limit, part.acks.next_offset)
                if hi > lo:
                    table.ack_range(part, lo, hi)
                    for o in delivered:
                        if lo <= o < hi:
                            model.state[o] = "acked"
        else:
            table.release(holder)
            for o, h in model.in_flight().items():
                if h == holder:
                    model.state[o] = "due"
        rewind_if_asked(table, model)
        check_state(table, model)
    # drain: whatever is in flight is acked, until every record is
    if drain_unordered:
        table.ordering = Ordering.UNORDERED
    for _ in range(4 * len(keys) + 4):
        for o in model.in_flight():
            table.ack(part, o)
            model.state[o] = "acked"
        if all(model.state.get(o) == "acked" for o in keys):
            break
        rewind_if_asked(table, model)
        got = table.take(len(keys), BIG, HOLDERS[0])
        for o in (o for s in got for o in s.offsets):
            model.state[o] = HOLDERS[0]
        check_state(table, model)
    assert all(model.state.get(o) == "acked" for o in keys), model.state
    assert part.acks.commit_point == max(keys) + 1
    assert part.acks.passed == 0 and part.acks.inflight == 0
    check_bytes(table, part)
