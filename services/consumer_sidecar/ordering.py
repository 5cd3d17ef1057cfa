"""A group's ordering (issue 39): which of a partition's next records may be handed out now
(pure: no I/O, no clock).

``unordered`` (the default, the mesh's behaviour before issue 39): a partition's records go
to whichever client asks, so two records of one key may be in flight to two clients at once.

``key``: records with the same key are never in flight to two clients at once, and are
handed out in offset order: a record is handed out only when no other record of its key is
in flight, and no record of its key below it is due again (nacked, timed out, its client
gone). A record without a key (a Kafka null) has no order to keep and is never held back.

``partition``: the same with one key per partition: a partition's records are in flight to
one client at a time, in order.

A partition's records are handed out in offset order (:mod:`acks`), so what may go out
next is a *prefix* of the records waiting in the buffer: :func:`eligible_prefix` counts it.
A record held back holds back the records after it in the same partition (head of line);
other partitions flow. Records handed out in one take go to one holder, in order, so a take
may carry several records of one key: they are in flight to one client. The caller's state
is the partition's unacked delivered records with their keys: in flight (parked for the
dead-letter topic counts as in flight) or due; a record whose key is not known (delivered
before the group switched to an ordered mode) is :data:`UNKNOWN` and holds back every key
until it is acked or given up.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum, StrEnum
from typing import Final

Key = bytes | None


class Ordering(StrEnum):
    UNORDERED = "unordered"
    KEY = "key"
    PARTITION = "partition"


class Kind(Enum):
    """What delivery will do with a buffered record (:meth:`acks.PartitionAcks.deliver`)."""

    NEW = "new"  # a first delivery
    DUE = "due"  # due again: delivered again
    SKIP = "skip"  # below the cursor, in flight elsewhere or acked: skipped, not handed out


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()  # the key of a record delivered while the group was unordered
_PARTITION: Final = b"\x00partition"  # partition mode: every record's ordering key
_SlotKey = bytes | _Unknown


def eligible_prefix(
    mode: Ordering,
    held: Iterable[tuple[int, Key | _Unknown, bool]],
    candidates: Iterable[tuple[int, Key, Kind]],
) -> int:
    """How many of ``candidates`` (the partition's buffered records, ascending offsets, as
    (offset, key, kind)) may be handed out now to one holder, from the first on.

    ``held``: the partition's unacked delivered records as (offset, key, due); a candidate
    that is due appears there too (as due)."""
    if mode is Ordering.UNORDERED:
        return sum(1 for _ in candidates)
    by_partition = mode is Ordering.PARTITION
    in_flight: set[_SlotKey] = set()
    dues: list[tuple[int, _SlotKey]] = []
    for offset, key, due in held:
        slot = _PARTITION if by_partition else key
        if slot is None:
            continue
        if due:
            dues.append((offset, slot))
        else:
            in_flight.add(slot)
    unknown_in_flight = UNKNOWN in in_flight
    dues.sort(key=lambda d: d[0])
    # due below the candidate and not handed out in this take, per key (hot path: no dues)
    waiting: dict[_SlotKey, int] = {}
    next_due = 0
    taken_due: set[int] = set()
    count = 0
    for offset, key, kind in candidates:
        slot = _PARTITION if by_partition else key
        if kind is Kind.SKIP or slot is None:
            count += 1
            continue
        if unknown_in_flight or slot in in_flight:
            break
        if dues:
            while next_due < len(dues) and dues[next_due][0] < offset:
                due_offset, due_slot = dues[next_due]
                if due_offset not in taken_due:
                    waiting[due_slot] = waiting.get(due_slot, 0) + 1
                next_due += 1
            if waiting.get(slot) or waiting.get(UNKNOWN):
                break
            if kind is Kind.DUE:
                taken_due.add(offset)
        count += 1
    return count
