"""The partition table under a group's ordering (issue 39): real column chunks taken by
several holders, acked, nacked, timed out and released; what each holder gets."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Message

from services.consumer_sidecar.ordering import Ordering
from services.consumer_sidecar.partitions import PartitionTable
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
    assert offsets(table, B) == []  # 2 is x: x is in flight to a (head of line)
    part = table.get(TP0)
    assert part is not None
    woken.clear()  # what the takes above may have woken: only the ack's counts
    table.ack(part, 0, "a")  # x acked: 2 (x) and 3 (no key) may go, 4 too
    assert woken
    assert offsets(table, B, 3) == [2, 3, 4]
    assert offsets(table, C) == []  # 5 is y, still in flight to a
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
    assert offsets(table, B) == []  # keys of 0 and 1 not known: wait for them
    part = table.get(TP0)
    assert part is not None
    table.ack_range(part, 0, 2, "a")
    assert offsets(table, B, 10) == [2, 3, 4, 5]
