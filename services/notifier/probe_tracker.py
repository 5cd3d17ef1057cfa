"""The end-to-end probe's bookkeeping (pure: no I/O; every time is passed in).

A probe is one small record produced to one partition of the probe topic, carrying the
producing instance, the partition, a sequence number and the wall-clock send time. The
:class:`ProbeTracker` follows each probe from *sent* to exactly one of:

* **received** — consumed back through the mesh within the timeout; its round trip (send →
  receipt, on the tracker's monotonic clock) is returned for the histogram;
* **lost** — not received within the timeout (:meth:`ProbeTracker.expire`);
* **late** — received after it had been counted lost (remembered for a bounded while);
* **failed** — the producer reported a delivery error: never sent, so neither lost nor late.

Records of another instance (or of an earlier run of this one: a restart picks a new
instance id) and second deliveries (the mesh redelivers what was not acked in time) are
*discarded*, never counted twice.

The PROBE_LOST fault follows the partitions that lost a probe: it opens when the first one
does and resolves once every such partition has delivered a later probe on time with no
older probe of it still pending (those will be lost: resolving before they are would make
the fault flap at every round after a long stop).
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from dataclasses import dataclass

PROBE_FORMAT = 1  # the "v" field of a probe record's value


@dataclass(frozen=True)
class ProbeMessage:
    instance: str
    partition: int
    seq: int
    sent_at_ms: int  # wall clock, for people reading the topic; round trips use the tracker's

    def key(self) -> bytes:
        return str(self.partition).encode()

    def value(self) -> bytes:
        return json.dumps(
            {
                "v": PROBE_FORMAT,
                "instance": self.instance,
                "partition": self.partition,
                "seq": self.seq,
                "sent_at_ms": self.sent_at_ms,
            },
            separators=(",", ":"),
        ).encode()


def decode(value: bytes | None) -> ProbeMessage:
    """A probe record's value → ProbeMessage; ValueError if it is not one."""
    if value is None:
        raise ValueError("probe record without a value")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"probe record is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != PROBE_FORMAT:
        raise ValueError("not a probe record of a known format")
    instance, partition, seq, sent = (
        data.get("instance"),
        data.get("partition"),
        data.get("seq"),
        data.get("sent_at_ms"),
    )
    if not isinstance(instance, str) or not instance:
        raise ValueError("probe record without an instance")
    for name, number in (("partition", partition), ("seq", seq), ("sent_at_ms", sent)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ValueError(f"probe record with a bad {name}: {number!r}")
    assert isinstance(partition, int) and isinstance(seq, int) and isinstance(sent, int)
    return ProbeMessage(instance, partition, seq, sent)


class Outcome(enum.Enum):
    RECEIVED = "received"  # on time
    LATE = "late"  # after it was counted lost
    DUPLICATE = "duplicate"  # this instance's probe, already received (a redelivery)
    FOREIGN = "foreign"  # another instance's (or an earlier run's) probe


@dataclass(frozen=True)
class Receipt:
    outcome: Outcome
    partition: int
    roundtrip_seconds: float | None = None  # set for RECEIVED and LATE


@dataclass(frozen=True)
class Lost:
    partition: int
    seq: int
    sent_at: float


@dataclass(frozen=True)
class FaultChange:
    """PROBE_LOST opens (``opened``) or resolves; ``partitions``: those that lost probes."""

    opened: bool
    partitions: tuple[int, ...]  # every partition that lost a probe in this episode
    lost: int  # probes lost in this episode so far


_Key = tuple[int, int]  # (partition, seq)


class ProbeTracker:
    def __init__(
        self,
        instance: str,
        timeout_seconds: float,
        *,
        remember_lost: int = 10_000,
        max_in_flight: int = 100_000,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.instance = instance
        self.timeout = timeout_seconds
        self._remember_lost = remember_lost
        self._max_in_flight = max_in_flight
        self._next_seq = 0
        # Insertion order = send order, so the oldest probe is always first.
        self._in_flight: OrderedDict[_Key, float] = OrderedDict()
        # The same probes per partition (seqs in send order): is an older one pending?
        self._pending: dict[int, OrderedDict[int, None]] = {}
        self._lost: OrderedDict[_Key, float] = OrderedDict()
        self._failing: set[int] = set()  # partitions whose last outcome was a loss
        self._open = False  # PROBE_LOST reported open
        self._episode_partitions: set[int] = set()  # partitions that lost since it opened
        self._episode_lost = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def failing_partitions(self) -> frozenset[int]:
        return frozenset(self._failing)

    def next_probe(self, partition: int, now: float, wall_ms: int) -> ProbeMessage:
        """A new probe for ``partition``, counted as sent at ``now`` (monotonic seconds)."""
        message = ProbeMessage(self.instance, partition, self._next_seq, wall_ms)
        self._next_seq += 1
        self._in_flight[(partition, message.seq)] = now
        self._pending.setdefault(partition, OrderedDict())[message.seq] = None
        if len(self._in_flight) > self._max_in_flight:
            # Only reachable if expire() is never called; keep memory bounded regardless.
            (old_partition, old_seq), _ = self._in_flight.popitem(last=False)
            self._unpend(old_partition, old_seq)
        return message

    def _unpend(self, partition: int, seq: int) -> None:
        pending = self._pending.get(partition)
        if pending is not None:
            pending.pop(seq, None)
            if not pending:
                del self._pending[partition]

    def _oldest_pending(self, partition: int) -> int | None:
        pending = self._pending.get(partition)
        return next(iter(pending)) if pending else None

    def produce_failed(self, message: ProbeMessage) -> None:
        """The producer could not deliver it: it never reached the topic, so it cannot be
        received. Not a loss of the mesh (Kafka errors are counted on their own)."""
        key = (message.partition, message.seq)
        if self._in_flight.pop(key, None) is not None:
            self._unpend(message.partition, message.seq)
        self._lost.pop(key, None)

    def received(self, message: ProbeMessage, now: float) -> Receipt:
        if message.instance != self.instance or message.seq >= self._next_seq:
            return Receipt(Outcome.FOREIGN, message.partition)
        key = (message.partition, message.seq)
        sent_at = self._in_flight.pop(key, None)
        if sent_at is not None:
            self._unpend(message.partition, message.seq)
            oldest = self._oldest_pending(message.partition)
            if oldest is None or oldest > message.seq:
                # Recovered only once no older probe of the partition is pending: those
                # were skipped and will be counted lost, which would reopen the fault at
                # every round while a stop's probes expire one by one (flapping).
                self._failing.discard(message.partition)
            return Receipt(Outcome.RECEIVED, message.partition, max(0.0, now - sent_at))
        sent_at = self._lost.pop(key, None)
        if sent_at is not None:
            return Receipt(Outcome.LATE, message.partition, max(0.0, now - sent_at))
        return Receipt(Outcome.DUPLICATE, message.partition)

    def expire(self, now: float) -> list[Lost]:
        """Probes sent more than the timeout ago and not received: lost, oldest first."""
        lost: list[Lost] = []
        while self._in_flight:
            key, sent_at = next(iter(self._in_flight.items()))
            if now - sent_at < self.timeout:
                break
            del self._in_flight[key]
            self._unpend(*key)
            self._lost[key] = sent_at
            if len(self._lost) > self._remember_lost:
                self._lost.popitem(last=False)
            self._failing.add(key[0])
            self._episode_partitions.add(key[0])
            lost.append(Lost(key[0], key[1], sent_at))
        self._episode_lost += len(lost)
        return lost

    def fault_change(self) -> FaultChange | None:
        """Whether PROBE_LOST opens or resolves now (each at most once per episode)."""
        if self._failing and not self._open:
            self._open = True
            return FaultChange(True, tuple(sorted(self._episode_partitions)), self._episode_lost)
        if self._failing:
            return None
        change = None
        if self._open:
            change = FaultChange(False, tuple(sorted(self._episode_partitions)), self._episode_lost)
        # Losses whose partitions recovered before anyone asked form no episode of their own.
        self._open = False
        self._episode_partitions = set()
        self._episode_lost = 0
        return change
