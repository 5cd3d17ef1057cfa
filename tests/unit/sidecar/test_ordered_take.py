"""The partition table under a group's ordering (issue 39): real column chunks taken by
several holders, acked, nacked, timed out and released; what each holder gets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Message

from services.consumer_sidecar import partitions
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.ordering import Ordering
from services.consumer_sidecar.partitions import PartitionTable, Redelivery
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime.topic_partition import TP
from tests.support.record_tables import table_holding

TP0 = TP("a", 0)
KEYS = [b"x", b"y", b"x", None, b"z", b"y"]  # offsets 0..5
A, B, C = ("a", 1), ("b", 1), ("c", 1)


def loaded(ordering: Ordering, on_unblocked: Callable[[], None] | None = None) -> PartitionTable:
    messages = [
        Message(topic="a", partition=0, offset=o, key=k, value=b"%d" % o)
        for o, k in enumerate(KEYS)
    ]
    table = table_holding(messages, on_unblocked)
    (run,), _ = runs_from_messages(messages)
    table.append(TP0, run.chunk)
    table.ordering = ordering
    return table


def offsets(table: PartitionTable, holder: tuple[str, int], n: int = 2) -> list[int]:
    return [o for s in table.take(n, 1 << 20, holder) for o in s.offsets]


def test_key_mode_holds_a_key_back_while_it_is_in_flight_and_lets_others_pass() -> None:
    woken = []
    table = loaded(Ordering.KEY, lambda: woken.append(1))
    assert offsets(table, A) == [0, 1]  # x, y to a
    assert offsets(table, B) == [3, 4]  # 2 is x, in flight to a: passed over; 3, 4 pass
    part = table.get(TP0)
    assert part is not None
    woken.clear()  # what the takes above may have woken: only the ack's counts
    table.ack(part, 0, "a")  # x acked: 2 (x) may go
    assert woken
    assert offsets(table, B, 3) == [2]  # 5 is y, still in flight to a
    assert offsets(table, C) == []
    table.ack(part, 1, "a")
    assert offsets(table, C) == [5]


def test_a_nacked_record_goes_out_again_before_the_later_records_of_its_key() -> None:
    table = loaded(Ordering.KEY)
    assert offsets(table, A) == [0, 1]
    part = table.get(TP0)
    assert part is not None
    _count, due = table.nack(part, 0, 1, "a", 0.0)  # x at 0 due again; rewind to it
    assert [p.tp for p in due.rewind] == [TP0]
    assert table.take(10, 1 << 20, B) == []  # rewinding: nothing until re-fetched
    table.rewind(TP0)
    messages = [
        Message(topic="a", partition=0, offset=o, key=k, value=b"%d" % o)
        for o, k in enumerate(KEYS)
    ]
    (run,), _ = runs_from_messages(messages)
    table.append(TP0, run.chunk)
    got = table.take(10, 1 << 20, B)
    # 0 (x) again, 1 (y) skipped (in flight to a), 2 (x) after it, 3 (no key), 4 (z); 5 is y
    assert [(o, s.deliveries) for s in got for o in s.offsets] == [
        (0, 2),
        (2, 1),
        (3, 1),
        (4, 1),
    ]


def test_partition_mode_hands_a_partition_to_one_holder_at_a_time() -> None:
    table = loaded(Ordering.PARTITION)
    assert offsets(table, A) == [0, 1]
    assert offsets(table, B) == []
    assert offsets(table, A) == []  # nor to the same holder: one take in flight
    part = table.get(TP0)
    assert part is not None
    table.ack_range(part, 0, 2, "a")
    assert offsets(table, B, 10) == [2, 3, 4, 5]


def test_a_holder_gone_frees_its_keys_and_its_records_go_first() -> None:
    table = loaded(Ordering.KEY)
    assert offsets(table, A) == [0, 1]
    table.release(A)
    part = table.get(TP0)
    assert part is not None
    assert part.acks.due == 2


def test_switched_live_from_unordered_records_already_in_flight_hold_every_key() -> None:
    table = loaded(Ordering.UNORDERED)
    assert offsets(table, A) == [0, 1]
    table.ordering = Ordering.KEY
    # keys of 0 and 1 not known: every key waits for them; 3 has no key: never held
    assert offsets(table, B) == [3]
    part = table.get(TP0)
    assert part is not None
    table.ack_range(part, 0, 2, "a")
    assert offsets(table, B, 10) == [2, 4, 5]


def test_key_mode_lets_other_keys_pass_a_held_record_of_the_partition() -> None:
    """No head of line (issue 39): k1@0 in flight to A holds k1@1 back, but not k2@2, k3@3
    behind it; k1@1 goes once k1@0 is acked."""
    messages = [
        Message(topic="a", partition=0, offset=o, key=k, value=b"%d" % o)
        for o, k in enumerate([b"k1", b"k1", b"k2", b"k3"])
    ]
    table = table_holding(messages)
    (run,), _ = runs_from_messages(messages)
    table.append(TP0, run.chunk)
    table.ordering = Ordering.KEY
    assert offsets(table, A, 1) == [0]
    assert offsets(table, B, 10) == [2, 3]
    part = table.get(TP0)
    assert part is not None
    assert part.acks.commit_point == 0
    table.ack_range(part, 2, 4, "b")
    assert part.acks.commit_point == 0  # k1@1, passed over, holds the commit point
    assert offsets(table, C, 10) == []  # k1 still in flight to a
    table.ack(part, 0, "a")
    assert part.acks.commit_point == 1  # not past k1@1: never delivered
    assert offsets(table, C, 10) == [1]
    table.ack(part, 1, "c")
    assert part.acks.commit_point == 4
    assert part.buffered_bytes == 0 and table.buffered_bytes == 0


def keyed_table(keys: list[bytes | None]) -> PartitionTable:
    messages = [
        Message(topic="a", partition=0, offset=o, key=k, value=b"%d" % o)
        for o, k in enumerate(keys)
    ]
    table = table_holding(messages)
    (run,), _ = runs_from_messages(messages)
    table.append(TP0, run.chunk)
    table.ordering = Ordering.KEY
    return table


def test_the_look_ahead_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LOOK_AHEAD records a held key holds its partition again; nothing past it is
    staged, and the staged records stay counted in the buffer."""
    monkeypatch.setattr(partitions, "LOOK_AHEAD", 4)
    table = keyed_table([b"k1"] * 6 + [b"k2"])
    assert offsets(table, A, 1) == [0]
    assert offsets(table, B, 10) == []  # k2@6 lies past the 4 records looked at
    part = table.get(TP0)
    assert part is not None and part.staged == [] and part.acks.passed == 0
    table = keyed_table([b"k1", b"k1", b"k1", b"k2", b"k1", b"k3"])
    assert offsets(table, A, 1) == [0]
    assert offsets(table, B, 10) == [3]  # k3@5 past the window
    part = table.get(TP0)
    assert part is not None and part.acks.passed == 2 and part.buffered_records == 4
    assert sum(len(s) for s in part.staged) == 2  # 1, 2: staged no further than 3


def test_a_parked_record_holds_its_key_and_the_passed_over_record_goes_after_it() -> None:
    table = keyed_table([b"k1", b"k1", b"k2"])
    table.redelivery = Redelivery(visibility=30.0, max_deliveries=1, dead_letter=True)
    assert offsets(table, A, 1) == [0]
    assert offsets(table, B, 10) == [2]  # k1@1 passed over
    part = table.get(TP0)
    assert part is not None
    _count, due = table.nack(part, 0, 1, "a", 0.0)  # delivered once: given up, parked
    assert [g.parked for _, g in due.given_up] == [True] and not part.rewinding
    assert offsets(table, C, 10) == []  # k1@0 parked: k1 still held
    assert part.acks.commit_point == 0
    table.ack(part, 0)  # on the dead-letter topic
    assert part.acks.commit_point == 1  # not past k1@1
    assert offsets(table, C, 10) == [1]


def test_a_lease_move_commits_below_the_passed_over_record_and_the_next_holder_gets_it() -> None:
    """The buffer dropped (revoke, suspension): the passed-over record is due, never
    delivered, the commit stops at it, and the acks above it go into the commit metadata
    so the next holder delivers it and skips what was acked."""
    table = keyed_table([b"k1", b"k1", b"k2", b"k3"])
    assert offsets(table, A, 1) == [0]
    assert offsets(table, B, 10) == [2, 3]
    part = table.get(TP0)
    assert part is not None
    table.ack(part, 0, "a")
    table.ack_range(part, 2, 4, "b")
    table.drop_buffer(part)  # the lease is revoked
    assert (part.acks.passed, part.acks.due, part.acks.inflight) == (0, 1, 0)
    assert part.buffered_bytes == 0 and table.buffered_bytes == 0
    point, acked_above, _version = table.commit_view(part)
    assert (point, acked_above) == (1, ((2, 3),))
    nxt = PartitionAcks(point, preacked=acked_above)  # the next holder, from the metadata
    assert nxt.deliver([1, 2, 3], 30.0, C) == [(0, 1, 1)]
    assert nxt.commit_point == 1 and nxt.next_offset == 4
