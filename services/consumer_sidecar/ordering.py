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

While records are re-read (a record came due: :mod:`acks`), what may go out next is a
*prefix* of the records waiting in the buffer: :func:`eligible_prefix` counts it, and a
record held back holds back the records after it in the same partition. Otherwise (every
candidate a first delivery, nothing due) ``key`` mode looks ahead (:func:`eligible_ahead`):
of the partition's next :data:`LOOK_AHEAD` buffered records, those whose key is not in
flight go out, and those held are *passed over* (they stay buffered, hold the commit point
back, and go out, in offset order, once their key is free): no head of line within the
look-ahead. ``partition`` mode has one key, so the prefix rule is already exact. Records
handed out in one take go to one holder, in order, so a take may carry several records of
one key: they are in flight to one client. The caller's state
is the partition's unacked delivered records with their keys: in flight (parked for the
dead-letter topic counts as in flight) or due; a record whose key is not known (delivered
before the group switched to an ordered mode) is :data:`UNKNOWN` and holds back every key
until it is acked or given up.

The take path asks on every take, for every partition: it summarises the partition's
unacked records once (:func:`held_of`: the keys in flight as a set, the due records) and,
in the common case of no due record and nothing re-read (every candidate a first delivery),
counts with :func:`eligible_new` over the candidates' keys alone; :func:`eligible_prefix`
is the general rule (the property tests check both agree).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
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


# ``key`` mode: how many of a partition's next buffered records a take looks at when the
# first one is held (records, the held-back ones included). A bound on the scan's cost per
# take and on the records passed over per partition (each stays buffered, counted against
# the partition's byte cap, until its key is free); a Stream's credit is in the thousands.
LOOK_AHEAD: Final = 4096

UNKNOWN: Final = _Unknown()  # the key of a record delivered while the group was unordered
_PARTITION: Final = b"\x00partition"  # partition mode: every record's ordering key
_SlotKey = bytes | _Unknown
HeldKey = Key | _Unknown  # the key of an unacked delivered record


@dataclass(frozen=True, slots=True)
class Held:
    """A partition's unacked delivered records as the gate reads them: the ordering keys
    (slots) of those in flight, and the due ones as (offset, slot), ascending."""

    in_flight: Set[_SlotKey]
    dues: list[tuple[int, _SlotKey]]


def held_of(
    mode: Ordering,
    in_flight: Iterable[HeldKey],
    dues: Iterable[tuple[int, HeldKey]],
) -> Held:
    """The gate's summary of a partition's unacked records: the keys of those in flight
    (repeats allowed), the due ones as (offset, key), in any order."""
    keys = set(in_flight)
    keyless = None in keys
    keys.discard(None)
    return held_counted(mode, keys, int(keyless), dues)


def held_counted(
    mode: Ordering, keys: Set[HeldKey], keyless: int, dues: Iterable[tuple[int, HeldKey]]
) -> Held:
    """:func:`held_of` from the keys in flight (without None, e.g. a live view of
    :class:`in_flight_keys.InFlightKeys`) and how many keyless records are in flight."""
    due: list[tuple[int, _SlotKey]]
    if mode is Ordering.PARTITION:
        slots: Set[_SlotKey] = {_PARTITION} if keys or keyless else frozenset()
        due = [(offset, _PARTITION) for offset, _ in dues]
    else:
        slots = keys  # type: ignore[assignment]
        due = [(offset, key) for offset, key in dues if key is not None]
    due.sort(key=lambda d: d[0])
    return Held(slots, due)


def eligible_new(mode: Ordering, held: Held, keys: Sequence[Key]) -> int:
    """:func:`eligible_prefix` when no record is due (``held.dues`` empty) and every
    candidate is a first delivery (:attr:`Kind.NEW`): from their keys alone, in order."""
    if mode is Ordering.UNORDERED or not held.in_flight:
        return len(keys)
    if mode is Ordering.PARTITION:
        return 0
    in_flight = held.in_flight
    if UNKNOWN in in_flight:  # only keyless records pass
        for count, key in enumerate(keys):
            if key is not None:
                return count
        return len(keys)
    if in_flight.isdisjoint(keys):  # the common case, in C (a Stream's credit: thousands)
        return len(keys)
    for count, key in enumerate(keys):
        if key in in_flight:  # None never is
            return count
    return len(keys)


def eligible_prefix(
    mode: Ordering,
    held: Iterable[tuple[int, HeldKey, bool]] | Held,
    candidates: Iterable[tuple[int, Key, Kind]],
) -> int:
    """How many of ``candidates`` (the partition's buffered records, ascending offsets, as
    (offset, key, kind)) may be handed out now to one holder, from the first on.

    ``held``: the partition's unacked delivered records as (offset, key, due), or their
    :func:`held_of` summary; a candidate that is due appears there too (as due)."""
    if mode is Ordering.UNORDERED:
        return sum(1 for _ in candidates)
    by_partition = mode is Ordering.PARTITION
    if not isinstance(held, Held):
        records = list(held)
        held = held_of(
            mode,
            (key for _, key, due in records if not due),
            ((offset, key) for offset, key, due in records if due),
        )
    in_flight = held.in_flight
    dues = held.dues
    unknown_in_flight = UNKNOWN in in_flight
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


def eligible_ahead(mode: Ordering, held: Held, keys: Sequence[Key]) -> list[bool]:
    """Which of ``keys`` (a partition's next buffered records, ascending offsets, every one
    a first delivery: never delivered, or passed over; no record due) may go out now to one
    holder, in offset order; the others are passed over.

    A key in flight stays in flight for the whole take, so its records in the window are
    all held (it keeps its offset order) and every other key's records all go (in offset
    order, to one holder). Keyless records are never held; a record of unknown key in
    flight holds every key; ``partition`` mode: all or nothing."""
    in_flight = held.in_flight
    if mode is Ordering.UNORDERED or not in_flight:
        return [True] * len(keys)
    if mode is Ordering.PARTITION:
        return [False] * len(keys)
    if UNKNOWN in in_flight:
        return [key is None for key in keys]
    return [key is None or key not in in_flight for key in keys]
