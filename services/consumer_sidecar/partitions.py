"""The sidecar's view of the partitions it leases: epoch, local deadline, buffer, acks.

Shared by the Kafka fetch thread (appends records) and the asyncio side (delivers, acks,
commits), so every buffer operation holds :attr:`PartitionTable.lock`. The local lease
deadline is the fencing rule of ARCHITECTURE §3.1: past it, a partition is neither
delivered nor committed, whatever else happens.

A partition's buffer is a queue of column chunks (:mod:`dsclient.records.batches`),
and delivery hands out slices of them: appending, taking and acking cost a few operations
per chunk or per range, not per record.

Redelivery (ARCHITECTURE §3 "Delivery"): each delivery is in flight with its holder (the
client, and the stream it went out on) until the group's visibility timeout
(:class:`Redelivery`); records that come due again (:mod:`acks`: deadline, nack, holder
gone, a response never sent) are re-read from Kafka. When a due record lies below a
partition's delivery cursor the partition is marked ``rewinding``: nothing more of it is
delivered until the fetch thread has dropped its buffer and moved its fetch position back
(:meth:`PartitionTable.rewind`), so a due record always goes out before the records after it.

``key`` ordering looks ahead past records whose key is in flight (ordering.py): a take
moves the partition's next records off its chunks into :attr:`Partition.staged` and hands
out the eligible ones; the others stay staged, *passed over* in the ack tracker (they hold
the commit point back) and still counted in the buffer's bytes and records, and the next
takes look at them first. Dropping the buffer makes them due (:meth:`acks.PartitionAcks.
unpass`): they are re-read from Kafka like due records.

One job, why whole (about 980 lines): the buffer and lease state the fetch thread and the
event loop share under one lock; every method holds it and keeps the buffer's byte and
record counts, the ack tracker and the ordering's keys in step. The pure rules are outside
(acks.py, ordering.py, in_flight_keys.py, stall_watch.py). The next seam, if it grows: the
``key`` look-ahead's staging (its own class over a partition, called under the lock).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import accumulate, islice, pairwise, repeat
from operator import add

from dsclient.records.batches import RECORD_OVERHEAD_BYTES, Chunk, Slice
from services.consumer_sidecar.acks import NO_HOLDER, NO_LIMIT, GivenUp, Holder, PartitionAcks
from services.consumer_sidecar.in_flight_keys import InFlightKeys
from services.consumer_sidecar.ordering import (
    LOOK_AHEAD,
    UNKNOWN,
    Held,
    HeldKey,
    Key,
    Kind,
    Ordering,
    eligible_ahead,
    eligible_new,
    eligible_prefix,
    held_counted,
)
from services.consumer_sidecar.stall_watch import StallWatch
from services.consumer_sidecar.stats import PartitionStats
from services.runtime.topic_partition import TP

# kafka_group mode (ARCHITECTURE §5.6): Kafka's group coordinator owns the partitions and
# fences commits by generation, so there is no lease. Such partitions carry epoch 0 and a
# deadline that never passes. Finite on purpose: Status turns the deadline into a Duration.
UNLEASED_EPOCH = 0
NO_DEADLINE = 1e10  # monotonic seconds (~317 years)

DEFAULT_VISIBILITY_SECONDS = 30.0
DEFAULT_MAX_DELIVERIES = 10

__all__ = [
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_VISIBILITY_SECONDS",
    "NO_DEADLINE",
    "RECORD_OVERHEAD_BYTES",
    "UNLEASED_EPOCH",
    "Due",
    "Partition",
    "Redelivery",
]


@dataclass(frozen=True)
class Redelivery:
    """The group's redelivery policy: a delivered record not acked within ``visibility``
    seconds is delivered again; one that comes due after ``max_deliveries`` deliveries is
    given up (``NO_LIMIT``: never): with ``dead_letter``, produced to the group's
    dead-letter topic before the commit point passes it (:mod:`dead_letter`)."""

    visibility: float = DEFAULT_VISIBILITY_SECONDS
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    dead_letter: bool = False

    @classmethod
    def of_group(
        cls, visibility: float | None, max_deliveries: int, defaults: Redelivery
    ) -> Redelivery:
        """The policy a group's config asks for (``GroupConfig.visibility_timeout``, unset:
        None; ``max_deliveries``, 0: unset, -1: never give up), the sidecar's where unset."""
        if max_deliveries == 0:
            limit = defaults.max_deliveries
        else:
            limit = NO_LIMIT if max_deliveries < 0 else max_deliveries
        return cls(visibility if visibility else defaults.visibility, limit, defaults.dead_letter)


@dataclass
class Due:
    """What one redelivery step did: records that came due (or were given up), the
    partitions that must rewind before delivering more, what was given up."""

    records: int = 0
    rewind: list[Partition] = field(default_factory=list)
    given_up: list[tuple[Partition, GivenUp]] = field(default_factory=list)

    def add(self, part: Partition, given_up: list[GivenUp]) -> None:
        self.given_up += [(part, g) for g in given_up]


@dataclass(frozen=True)
class Reverted:
    """Revert mode (issue 23): an external commit this sidecar committed over."""

    tp: TP
    epoch: int
    restored: int  # the position committed over it
    external: int  # the offset the external commit had set
    metadata: str  # that commit's metadata


# Ordered modes: a partition's offset → key map is pruned below the commit point once it
# holds this many more entries than twice the records from there on.
PRUNE_KEYS_ABOVE = 1024


@dataclass
class Partition:
    tp: TP
    epoch: int
    deadline: float  # monotonic seconds; nothing is delivered or committed after it
    acks: PartitionAcks
    committed: int = -1  # the last offset committed to Kafka by this lease
    committed_version: int = 0  # acks.version at that commit (acked-above ranges included)
    buffer: deque[Chunk] = field(default_factory=deque)  # chunk.start: first undelivered
    buffered_bytes: int = 0
    buffered_records: int = 0
    revoking: bool = False
    # A due record lies below the delivery cursor: nothing is delivered until the fetch
    # thread has dropped the buffer and moved the fetch position back (PartitionTable.rewind).
    rewinding: bool = False
    paused: bool = False
    position: int = -1  # next offset the fetcher will append
    # False between the grant and the moment Kafka fetching is set up. The partition is
    # already held (heartbeats renew it) but nothing is delivered or committed yet.
    ready: bool = False
    # False from a grant until the assigner acknowledges a heartbeat that named it
    # (ARCHITECTURE §3.1.6): until then the lease is held and fetched, never delivered or
    # committed, and has no deadline of its own. A grant delayed in flight therefore
    # cannot overlap a later grant of the partition elsewhere: the assigner renews only
    # the grant it still counts as current.
    confirmed: bool = True
    # Set when the local lease deadline passed: nothing is delivered or committed and
    # fetching is paused, but the lease is still reported, so a renewal (e.g. by a
    # restarted assigner adopting it) resumes it; an ack that does not renew it drops it.
    suspended_at: float | None = None
    # Monotonic time of the grant (kafka_group: of Kafka's assignment): the start of the
    # handoff gap (fetch_gaps.HandoffGaps).
    granted_at: float = 0.0
    # A commit this sidecar did not make, found in Kafka (issue 23): (offset, metadata).
    # Nothing more is committed for the partition; heartbeats report it until the lease ends
    # (the assigner applies it like an offset reset).
    external: tuple[int, str] | None = None
    external_announced: bool = False
    # Revert mode: external commits committed over, until the next heartbeat reports them.
    reverted: list[Reverted] = field(default_factory=list)
    fetched_bytes: int = 0  # cumulative, for the bytes/s reported to the assigner
    high_watermark: int = -1  # from librdkafka statistics; -1 = not known yet
    lag: int = -1  # records behind the high watermark; -1 = not known yet
    _rate_mark: tuple[float, int] | None = None
    # Ordered modes (ordering.py): the key of each record handed out, by offset, while it
    # may still be un-acked (pruned below the commit point now and then: PRUNE_KEYS_ABOVE).
    keys: dict[int, Key] = field(default_factory=dict)
    # Ordered modes: each buffered chunk's keys (by record index), read once per chunk,
    # not on every take (pruned to the buffer's chunks after each take).
    chunk_keys: dict[Chunk, list[Key]] = field(default_factory=dict)
    # ``key`` ordering's look-ahead: records taken off the buffer's chunks, not handed out,
    # ascending, all below the buffer's (each slice wholly passed over, below
    # acks.next_offset, or wholly not reached yet); counted in buffered_bytes/_records.
    staged: list[Slice] = field(default_factory=list)
    # Ordered modes: the keys in flight, kept from take to take (in_flight_keys.py).
    in_flight: InFlightKeys = field(default_factory=InFlightKeys)
    # commit_fencing: kafka when granted (issue 36): commits go through the lease's
    # transactional producer and the confirmed lease has no deadline. Fixed for the
    # lease's life: a change of the group's setting applies to the next grant.
    kafka_fenced: bool = False
    # commit_fencing: kafka: the number of the stall of this process (stall_watch.py) that
    # left the lease unverified, 0 when verified. Nothing of it is delivered until a
    # commit made after that stall succeeds (LeaseCommitter.commit_all) or Kafka fences it.
    unverified: int = 0

    def take_rate(self, now: float) -> float:
        """Bytes/s fetched since the previous call (0.0 on the first)."""
        mark, self._rate_mark = self._rate_mark, (now, self.fetched_bytes)
        if mark is None or now <= mark[0]:
            return 0.0
        return (self.fetched_bytes - mark[1]) / (now - mark[0])

    def reported_lag(self) -> int:
        """Lag of the committed offset: what the group is behind, as Kafka tools see it."""
        if self.high_watermark >= 0 and self.committed >= 0:
            return max(0, self.high_watermark - self.committed)
        return self.lag

    def live(self, now: float) -> bool:
        return self.confirmed and now < self.deadline


class PartitionTable:
    def __init__(
        self,
        buffer_max_bytes: int,
        clock: Callable[[], float],
        *,
        on_unblocked: Callable[[], None] | None = None,
    ) -> None:
        """``on_unblocked``: an ack let a partition held back by its ordering deliver again
        (the wiring wakes the Streams waiting for records: the DataSignal's notify). The
        other hooks below are set by the parts that own the other end (the fetch loop,
        redelivery, the backpressure watch, the lease commit path)."""
        self.lock = threading.Lock()
        self.partitions: dict[TP, Partition] = {}
        # The operator's cap on the sidecar's record memory: this buffer, what librdkafka
        # prefetches for it, and what open ReadRange streams reserved (read_budget.py).
        self.buffer_max_bytes = buffer_max_bytes
        self.reserved_bytes = 0  # held by open ReadRange streams; set on the event loop
        self.prefetch_bytes = 0  # what the fetch consumer may hold prefetched (the Fetcher's)
        self.buffered_bytes = 0
        self.clock = clock
        self._cursor = 0  # round-robin start for fair delivery across partitions
        # Set by the fetch thread while it holds consumption back on a full buffer (leased
        # mode; Fetcher._holding); ``on_room`` wakes it when a delivery made room below
        # ``hold_at`` (the cap less what librdkafka may hold prefetched meanwhile).
        self.holding = False
        self.on_room: Callable[[], None] = lambda: None
        # Records were handed out (or nacked with a delay): an ack deadline now exists,
        # which the redelivery loop sleeps towards (Redeliverer.redelivery_loop).
        self.on_in_flight: Callable[[], None] = lambda: None
        # The fetch thread started holding consumption back, or paused partitions past
        # their cap: wakes the CLIENT_BACKPRESSURE watcher (backpressure_watch.py).
        self.on_backpressure: Callable[[], None] = lambda: None
        self.redelivery = Redelivery()  # the group's policy; the session updates it
        # No record is handed out when less than this is left of a partition's local lease:
        # what was delivered can still be acked and committed under the lease. Without it,
        # a batch taken just before the deadline (the assigner away for longer than a TTL)
        # is acked just after it, refused, and delivered again.
        self.delivery_margin = 0.0
        # The group's ordering (issue 39; the session updates it, live): which buffered
        # records may be handed out while others of their key or partition are un-acked.
        self._ordering = Ordering.UNORDERED
        # Records staged by ``key`` ordering may be left after a switch to unordered: takes
        # go through the ordered path (all eligible) until none is.
        self._staged_left = False
        # An ack let a partition held back by its ordering deliver again: wakes the
        # Streams waiting for records (the DataSignal's notify).
        self.on_unblocked: Callable[[], None] = on_unblocked or (lambda: None)
        # This process was away (stall_watch.py): the session sets the limit from the
        # group's TTL; the fetch thread (alive) and every delivery (take) look at the clock.
        self.stall = StallWatch()
        # A stall was seen (its length, the Kafka-fenced leases it left unverified): the
        # lease keeper logs it and has them committed. Either thread, with the lock held.
        self.on_stalled: Callable[[float, int], None] = lambda _gap, _leases: None

    @property
    def ordering(self) -> Ordering:
        return self._ordering

    @ordering.setter
    def ordering(self, mode: Ordering) -> None:
        with self.lock:
            self._ordering = mode
            if mode is Ordering.UNORDERED:
                self._staged_left = any(p.staged for p in self.partitions.values())

    @property
    def leased_cap(self) -> int:
        """What this buffer may hold: the cap less what open ReadRange streams reserved."""
        return self.buffer_max_bytes - self.reserved_bytes

    @property
    def hold_at(self) -> int:
        """Where the fetch thread holds consumption back: the leased cap less what
        librdkafka may hold prefetched meanwhile, so both together stay in it."""
        cap = self.leased_cap
        return max(cap // 2, cap - self.prefetch_bytes)

    def holds_at_least(self, records: int, max_bytes: int) -> bool:
        """At least ``records`` records or ``max_bytes`` bytes are buffered (whether they
        can all be taken now or not): a Stream lingering for more need not wait."""
        if self.buffered_bytes >= max_bytes:
            return True
        with self.lock:
            return sum(p.buffered_records for p in self.partitions.values()) >= records

    def per_partition_cap(self, share: int = 1) -> int:
        """A partition's buffer cap: ``share`` times its fair share of the total."""
        fair = self.leased_cap // max(len(self.partitions), 1)
        return max(share * fair, 64 * 1024)

    def append(self, tp: TP, chunk: Chunk) -> bool:
        """Fetch thread: buffer a chunk of a held partition. False if not held any more."""
        with self.lock:
            part = self.partitions.get(tp)
            if part is None or part.revoking or not part.ready or part.suspended_at is not None:
                return False
            chunk.skip_below(part.position)  # a re-fetch after a seek: already buffered
            if chunk.start >= len(chunk):
                return True
            size = chunk.remaining_bytes()
            part.buffer.append(chunk)
            part.buffered_bytes += size
            part.buffered_records += len(chunk) - chunk.start
            part.fetched_bytes += size
            self.buffered_bytes += size
            part.position = chunk.offsets[-1] + 1
            return True

    def alive(self, now: float) -> None:
        """Any thread: the process runs at ``now`` (the fetch thread calls it on every
        turn of its loop). After a stall, Kafka-fenced leases are unverified. Without one
        (nearly always) the table's lock is not taken (StallWatch.running)."""
        if self.stall.running(now):
            return
        with self.lock:
            self._seen_locked(now)

    def _seen_locked(self, now: float) -> None:
        """Lock held. :meth:`alive`'s work: after a stall, mark the Kafka-fenced leases
        unverified and tell :attr:`on_stalled`."""
        gap = self.stall.seen(now)
        if gap is None:
            return
        marked = 0
        for part in self.partitions.values():
            if part.kafka_fenced and not part.revoking:
                part.unverified = self.stall.stalls
                marked += 1
        self.on_stalled(gap, marked)

    def verified(self, part: Partition, stall: int) -> bool:
        """A commit of ``part`` requested while it was unverified by ``stall`` succeeded:
        deliverable again, unless a later stall came meanwhile. True if it changed."""
        with self.lock:
            if part.unverified and part.unverified == stall:
                part.unverified = 0
                return True
            return False

    def take(self, max_records: int, max_bytes: int, holder: Holder = NO_HOLDER) -> list[Slice]:
        """Delivery: up to the limits from live partitions, fairly, marked delivered to
        ``holder`` (in flight until the visibility timeout). At least one record when any
        is buffered, whatever its size. None of a lease left unverified by a stall of this
        process (stall_watch.py)."""
        now = self.clock()
        out: list[Slice] = []
        with self.lock:
            self._seen_locked(now)
            until = now + self.delivery_margin  # live for at least the margin
            parts = [
                p
                for p in self.partitions.values()
                if (p.buffer or p.staged)
                and p.ready
                and not p.revoking
                and not p.rewinding
                and not p.unverified
                and p.live(until)
            ]
            if not parts:
                return out
            start = self._cursor % len(parts)
            self._cursor += 1
            ordered = parts[start:] + parts[:start]
            budget = _Budget(max_records, max_bytes)
            due_at = now + self.redelivery.visibility
            # Ordered modes: how many of each partition's next records may go out now, and
            # for those that look ahead, which (plans).
            plans: dict[TP, _Plan] = {}
            allowed = self._allowed(ordered, max_records, plans)
            if allowed is not None:
                ordered = [p for p in ordered if allowed[p.tp]]
            # Take a fair share per partition per pass, repeating until limits are hit.
            while ordered and budget.open():
                share = max(1, budget.records // len(ordered))
                next_round = []
                for part in ordered:
                    taking = _Taking(part, budget, holder, due_at)
                    count = min(share, budget.records)
                    if allowed is not None:
                        count = min(count, allowed[part.tp])
                        before = budget.records
                        plan = plans.get(part.tp)
                        if plan is None:
                            self._take_from(taking, count, out)
                        else:
                            self._take_planned(taking, plan, count, out)
                        allowed[part.tp] -= before - budget.records
                    else:
                        self._take_from(taking, count, out)
                    if (part.buffer or part.staged) and (allowed is None or allowed[part.tp]):
                        next_round.append(part)
                    if not budget.open():
                        break
                ordered = next_round
            if allowed is not None:
                for tp, plan in plans.items():
                    self.partitions[tp].staged = plan.left()
                self._record_keys(out)
                if self._staged_left and self._ordering is Ordering.UNORDERED:
                    self._staged_left = any(p.staged for p in self.partitions.values())
            room = out and self.buffered_bytes < self.hold_at
        if room:
            self.on_room()
        if out:
            self.on_in_flight()
        return out

    def _allowed(
        self, parts: list[Partition], limit: int, plans: dict[TP, _Plan]
    ) -> dict[TP, int] | None:
        """Lock held. Ordered modes: for each partition, how many of its next buffered
        records may be handed out now (ordering.py), and in ``plans`` which ones for the
        partitions that look ahead; None when the group is unordered."""
        mode = self._ordering
        if mode is Ordering.UNORDERED:
            if not self._staged_left:
                return None
            return self._allowed_left(parts, limit, plans)
        allowed = {}
        for part in parts:
            keys = part.keys
            acks = part.acks
            runs = acks.unacked_runs()
            # what is in flight, from the runs that changed (before pruning their keys)
            part.in_flight.sync(((lo, hi) for lo, hi, due in runs if not due), keys)
            commit_point = acks.commit_point
            if len(keys) > 2 * (acks.next_offset - commit_point) + PRUNE_KEYS_ABOVE:
                # the keys below the commit point are not read again: dropped in one pass
                # now and then (deleting from a dict's front one by one costs a scan each)
                part.keys = keys = {o: k for o, k in keys.items() if o >= commit_point}
            dues: list[tuple[int, HeldKey]] = [
                (offset, keys.get(offset, UNKNOWN))
                for lo, hi, due in runs
                if due
                for offset in range(lo, hi)
            ]
            held = held_counted(mode, part.in_flight.keys, part.in_flight.keyless, dues)
            # no record due, no re-read: every candidate a first delivery (staged, or
            # buffered: offsets only grow in the buffer)
            fresh = not held.dues and acks.cursor == acks.next_offset
            if part.staged:
                # passed-over records go first; while records are re-read there are none
                # (dropping the buffer made them due), so this waits for the rewind
                allowed[part.tp] = self._plan(part, mode, held, limit, plans) if fresh else 0
                continue
            first_chunk = part.buffer[0]
            if fresh and first_chunk.offsets[first_chunk.start] >= acks.next_offset:
                n = eligible_new(mode, held, _next_keys(part, limit))
                if n < limit and n < part.buffered_records and mode is Ordering.KEY:
                    n = self._plan(part, mode, held, limit, plans)  # held: look ahead
                allowed[part.tp] = n
            else:
                candidates = islice(_candidates(part), limit)
                allowed[part.tp] = eligible_prefix(mode, held, candidates)
        return allowed

    def _allowed_left(
        self, parts: list[Partition], limit: int, plans: dict[TP, _Plan]
    ) -> dict[TP, int]:
        """Lock held. Unordered with records staged by ``key`` ordering left: those go
        first (all eligible), then the buffer as usual."""
        allowed = {}
        nothing = Held(frozenset(), [])
        for part in parts:
            if not part.staged:
                allowed[part.tp] = limit
            elif part.acks.cursor == part.acks.next_offset:
                allowed[part.tp] = self._plan(part, Ordering.UNORDERED, nothing, limit, plans)
            else:
                allowed[part.tp] = 0  # waits for the rewind (the staged records are due)
        return allowed

    def _plan(
        self, part: Partition, mode: Ordering, held: Held, limit: int, plans: dict[TP, _Plan]
    ) -> int:
        """Lock held, nothing due, no re-read. Look ahead: which of the partition's next
        records (the staged ones first, then the buffer's, up to :data:`LOOK_AHEAD`) may go
        out now (ordering.eligible_ahead); stage the buffer's up to the last eligible one
        within ``limit`` eligible, and plan the take (``plans``). How many may go out."""
        keys: list[Key] = []
        for s in part.staged:
            keys += _chunk_keys(part, s.chunk)[s.lo : s.hi]
        mask = eligible_ahead(mode, held, keys)
        found = sum(mask)
        window = max(LOOK_AHEAD, len(keys))
        reader = _KeyReader(part)
        # the buffer's records, a segment at a time, until enough are found
        while found < limit and len(mask) < window:
            step = min(window - len(mask), max(limit - found, 64))
            more = reader.read(step)
            if not more:
                break
            segment = eligible_ahead(mode, held, more)
            mask += segment
            found += sum(segment)
        if not found:
            return 0
        last = len(mask) - 1 - mask[::-1].index(True)
        if found > limit:  # stage no further than the limit-th eligible record
            seen = 0
            for i, ok in enumerate(mask):
                seen += ok
                if seen == limit:
                    last = i
                    break
            found = limit
        staged = len(keys)
        self._stage(part, last + 1 - staged)
        # the plan holds the staged records until the take ends (_Plan.left)
        plans[part.tp] = _Plan(list(part.staged), mask)
        return found

    def _stage(self, part: Partition, count: int) -> None:
        """Lock held: move the buffer's next ``count`` records to ``part.staged`` (still
        buffered: the byte and record counts do not change)."""
        tp = part.tp
        while count > 0 and part.buffer:
            chunk = part.buffer[0]
            n = min(count, len(chunk) - chunk.start)
            part.staged.append(chunk.take(n, tp.topic, tp.partition, part.epoch))
            if chunk.start == len(chunk):
                part.buffer.popleft()
            count -= n

    def _take_planned(self, taking: _Taking, plan: _Plan, count: int, out: list[Slice]) -> None:
        """Up to ``count`` eligible records of a planned partition within the byte budget
        (lock held): the ineligible ones before them are passed over."""
        part, budget, acks = taking.part, taking.budget, taking.part.acks
        slices, mask = plan.slices, plan.mask
        while count > 0 and plan.pos < len(slices):
            s = slices[plan.pos]
            n, at = len(s), plan.at
            ok = mask[at]
            try:  # the records from here on of the same eligibility (in C)
                run = mask.index(not ok, at, at + n) - at
            except ValueError:
                run = n
            if not ok:
                held = plan.step(s, run)
                if held.first_offset >= acks.next_offset:
                    acks.pass_over(held.offsets)
                plan.kept.append(held)
                continue
            m = _fitting(s, min(run, count), budget.bytes)
            if m == 0:
                if not budget.first:
                    budget.bytes = 0  # the next record does not fit: this take is full
                    return
                m = 1  # one record always goes, whatever its size
            taken = plan.step(s, m)
            size = _slice_bytes(taken)
            part.buffered_bytes -= size
            part.buffered_records -= m
            self.buffered_bytes -= size
            count -= m
            budget.spend(m, size)
            if taken.first_offset < acks.next_offset:  # passed over before: its first delivery
                acks.deliver_passed(
                    taken.first_offset, taken.last_offset + 1, taking.due_at, taking.holder
                )
                out.append(taken)
            else:
                out.extend(self._deliver(taking, taken))

    def _record_keys(self, slices: list[Slice]) -> None:
        """Lock held: the keys of the records just handed out, for the ordering gate."""
        parts: dict[TP, Partition] = {}
        for s in slices:
            part = self.partitions.get(TP(s.topic, s.partition))
            if part is None:
                continue
            parts[part.tp] = part
            offsets, keys = s.chunk.offsets[s.lo : s.hi], _chunk_keys(part, s.chunk)[s.lo : s.hi]
            part.keys.update(zip(offsets, keys, strict=True))
        for part in parts.values():  # forget the chunks handed out in full
            if len(part.chunk_keys) > len(part.buffer) + len(part.staged):
                live = set(part.buffer).union(s.chunk for s in part.staged)
                part.chunk_keys = {c: k for c, k in part.chunk_keys.items() if c in live}

    def _take_from(self, taking: _Taking, count: int, out: list[Slice]) -> None:
        """Up to ``count`` records of a partition within the byte budget (lock held)."""
        part, budget = taking.part, taking.budget
        while count > 0 and part.buffer:
            chunk = part.buffer[0]
            n = chunk.fitting(count, budget.bytes)
            if n == 0:
                if not budget.first:
                    budget.bytes = 0  # the next record does not fit: this take is full
                    return
                n = 1  # one record always goes, whatever its size
            before = chunk.remaining_bytes()
            taken = chunk.take(n, part.tp.topic, part.tp.partition, part.epoch)
            if chunk.start == len(chunk):
                part.buffer.popleft()
            size = before - chunk.remaining_bytes()
            part.buffered_bytes -= size
            part.buffered_records -= n
            self.buffered_bytes -= size
            count -= n
            budget.spend(n, size)
            out.extend(self._deliver(taking, taken))

    @staticmethod
    def _deliver(taking: _Taking, taken: Slice) -> list[Slice]:
        """Mark a slice's records delivered; the slices to send. Records a previous owner
        acked before a handoff are skipped (not delivered again); while due records are
        re-read, only those go out (records in flight elsewhere or acked are skipped)."""
        first, last = taken.first_offset, taken.last_offset
        acks = taking.part.acks
        if acks.plain(first, last):
            if last - first == len(taken) - 1:
                acks.delivered_run(first, last + 1, taking.due_at, taking.holder)
            else:  # gaps (compaction, transaction markers)
                acks.delivered_offsets(taken.offsets, taking.due_at, taking.holder)
            return [taken]
        return taken.pieces(acks.deliver(taken.offsets, taking.due_at, taking.holder))

    def ack(self, part: Partition, offset: int, client: str | None = None) -> bool:
        """Ack under the table lock: delivery (take) updates the same tracker. ``client``:
        the acking client, refused for a record in flight to another one."""
        with self.lock:
            moved = part.acks.ack(offset, client)
        self._acked(part)
        return moved

    def ack_range(self, part: Partition, lo: int, hi: int, client: str | None = None) -> bool:
        """Ack every delivered record of [lo, hi) under the table lock."""
        with self.lock:
            moved = part.acks.ack_range(lo, hi, client)
        self._acked(part)
        return moved

    def _acked(self, part: Partition) -> None:
        """Ordered modes: an ack may let buffered records of the partition go out; the
        Streams waiting for records look again."""
        if self.ordering is not Ordering.UNORDERED and (part.buffer or part.staged):
            self.on_unblocked()

    def ack_slices(self, slices: list[Slice]) -> None:
        """auto_ack: the slices just written to the client count as acked."""
        with self.lock:
            for s in slices:
                part = self.partitions.get(TP(s.topic, s.partition))
                if part is not None and part.epoch == s.epoch:
                    part.acks.ack_range(s.first_offset, s.last_offset + 1)
        if self.ordering is not Ordering.UNORDERED and slices:
            self.on_unblocked()

    # ---- redelivery (each returns what came due; the caller rewinds and reports) --------

    def redeliver_slices(self, slices: list[Slice]) -> Due:
        """Slices taken for a response that was never sent: due again now."""
        due = Due()
        with self.lock:
            for s in slices:
                part = self.partitions.get(TP(s.topic, s.partition))
                if part is not None and part.epoch == s.epoch:
                    before = part.acks.due
                    limit = self._limit_of(part)
                    due.add(part, part.acks.redeliver(s.first_offset, s.last_offset + 1, limit))
                    due.records += part.acks.due - before
                    self._check_rewind(part, due)
        return due

    def release(self, holder: Holder) -> Due:
        """``holder`` went away (its stream ended): what it has in flight is due again."""
        return self._each(lambda part, limit: part.acks.release(holder, limit))

    def next_deadline(self) -> float:
        """The earliest ack deadline of a record in flight in a ready partition (inf:
        none): when :meth:`expire` next has something to do."""
        with self.lock:
            return min(
                (p.acks.next_deadline() for p in self.partitions.values() if p.ready),
                default=math.inf,
            )

    def expire(self, now: float) -> Due:
        """Records whose ack deadline passed are due again."""
        return self._each(lambda part, limit: part.acks.expire(now, limit))

    def nack(self, part: Partition, lo: int, hi: int, client: str, delay: float) -> tuple[int, Due]:
        """``client`` gives its records of [lo, hi) in flight back, to be delivered again
        after ``delay`` seconds; how many records that concerned. Raises AckError."""
        due = Due()
        with self.lock:
            before = part.acks.due
            count, given_up = part.acks.nack(
                lo, hi, client, self.clock(), delay, self._limit_of(part)
            )
            due.add(part, given_up)
            due.records += part.acks.due - before
            self._check_rewind(part, due)
        if count and delay > 0:
            self.on_in_flight()  # due again at a deadline of its own
        self._given_up_unblocks(due)
        return count, due

    def nack_all(self, client: str, delay: float) -> tuple[int, Due]:
        """Every record of ``client`` in flight, in every partition, given back."""
        total = 0
        due = Due()
        for part in self.snapshot():
            acks = part.acks
            if acks.next_offset > acks.commit_point and part.ready:
                count, more = self.nack(part, acks.commit_point, acks.next_offset, client, delay)
                total += count
                due.records += more.records
                due.rewind += more.rewind
                due.given_up += more.given_up
        return total, due

    def _each(self, step: Callable[[Partition, int], list[GivenUp]]) -> Due:
        due = Due()
        with self.lock:
            for part in self.partitions.values():
                if not part.ready:
                    continue
                before = part.acks.due
                due.add(part, step(part, self._limit_of(part)))
                due.records += part.acks.due - before
                self._check_rewind(part, due)
        self._given_up_unblocks(due)
        return due

    def _given_up_unblocks(self, due: Due) -> None:
        """Ordered modes: a record given up (not parked) no longer holds its key back."""
        if self.ordering is not Ordering.UNORDERED and any(not g.parked for _, g in due.given_up):
            self.on_unblocked()

    def _limit_of(self, part: Partition) -> int:
        """The delivery limit for a redelivery step on ``part``; what it gives up is
        parked for the dead-letter topic when the group has one (:mod:`acks`)."""
        part.acks.park_given_up = self.redelivery.dead_letter
        return self.redelivery.max_deliveries

    @staticmethod
    def _check_rewind(part: Partition, due: Due) -> None:
        """Lock held: stop delivering ``part`` until it is rewound, if a due record lies
        below its cursor."""
        if not part.rewinding and part.acks.refetch_from() is not None:
            part.rewinding = True
            due.rewind.append(part)

    def rewind(self, tp: TP) -> int | None:
        """Fetch thread: drop the buffer of a partition marked ``rewinding`` and move its
        position back to where its due records start; that offset (the caller seeks the
        consumer there), or None when nothing is to be done."""
        with self.lock:
            part = self.partitions.get(tp)
            if part is None or not part.rewinding:
                return None
            part.rewinding = False
            part.acks.unpass()  # passed-over records are re-read with the due ones
            offset = part.acks.rewind()
            self._drop_locked(part)
            part.position = offset
            return offset

    def restart(self, part: Partition, offset: int) -> None:
        """Forget everything buffered and in flight for ``part`` and deliver it from
        ``offset`` on (acks of what was delivered before are refused from now on); the
        caller moves the consumer's position there."""
        with self.lock:
            self._drop_locked(part)
            part.acks = PartitionAcks(offset)
            part.position = offset
            part.rewinding = False

    def commit_view(self, part: Partition) -> tuple[int, tuple[tuple[int, int], ...], int]:
        """(commit point, acked ranges above it, acks version), read consistently."""
        with self.lock:
            ranges = tuple(part.acks.acked_above())
            return part.acks.commit_point, ranges, part.acks.version

    def drop_buffer(self, part: Partition) -> None:
        with self.lock:
            self._drop_locked(part)

    def _drop_locked(self, part: Partition) -> None:
        """Lock held: forget the buffer; records passed over in it become due (re-read
        from Kafka after the rewind the caller makes)."""
        part.acks.unpass()
        self.buffered_bytes -= part.buffered_bytes
        part.buffer.clear()
        part.staged.clear()
        part.chunk_keys.clear()
        part.buffered_bytes = 0
        part.buffered_records = 0

    def add(self, part: Partition) -> None:
        with self.lock:
            old = self.partitions.pop(part.tp, None)
            if old is not None:
                self.buffered_bytes -= old.buffered_bytes
            self.partitions[part.tp] = part

    def remove(self, tp: TP) -> Partition | None:
        with self.lock:
            part = self.partitions.pop(tp, None)
            if part is not None:
                self.buffered_bytes -= part.buffered_bytes
            return part

    def get(self, tp: TP) -> Partition | None:
        with self.lock:
            return self.partitions.get(tp)

    def apply_stats(self, stats: Mapping[TP, PartitionStats]) -> None:
        with self.lock:
            for tp, pstats in stats.items():
                part = self.partitions.get(tp)
                if part is not None:
                    part.high_watermark = pstats.high_watermark
                    part.lag = pstats.lag

    def snapshot(self) -> list[Partition]:
        with self.lock:
            return list(self.partitions.values())


def _chunk_keys(part: Partition, chunk: Chunk) -> list[Key]:
    """Lock held: every key of ``chunk`` by record index, read once per chunk."""
    found = part.chunk_keys.get(chunk)
    if found is None:
        lengths = chunk.key_lengths
        if lengths is None:
            found = [None] * len(chunk)
        else:
            blob = chunk.keys
            found = [blob[a:b] for a, b in pairwise(accumulate(lengths, initial=0))]
            for k in chunk.key_nulls:
                found[k] = None
        part.chunk_keys[chunk] = found
    return found


def _next_keys(part: Partition, limit: int) -> list[Key]:
    """Lock held: the keys of the partition's next ``limit`` buffered records, in order."""
    out: list[Key] = []
    for chunk in part.buffer:
        out += _chunk_keys(part, chunk)[chunk.start : chunk.start + limit - len(out)]
        if len(out) >= limit:
            break
    return out


class _KeyReader:
    """Lock held: the keys of a partition's buffered records, read ``count`` at a time."""

    def __init__(self, part: Partition) -> None:
        self.part = part
        self.index = 0  # the chunk
        self.k = part.buffer[0].start if part.buffer else 0  # the record in it

    def read(self, count: int) -> list[Key]:
        out: list[Key] = []
        buffer = self.part.buffer
        while len(out) < count and self.index < len(buffer):
            chunk = buffer[self.index]
            hi = min(len(chunk), self.k + count - len(out))
            out += _chunk_keys(self.part, chunk)[self.k : hi]
            if hi == len(chunk):
                self.index += 1
                self.k = buffer[self.index].start if self.index < len(buffer) else 0
            else:
                self.k = hi
        return out


def _slice_bytes(s: Slice) -> int:
    """Key, value, header and bookkeeping bytes of a slice (as Chunk.remaining_bytes)."""
    size = s.data_bytes() + RECORD_OVERHEAD_BYTES * len(s)
    ends = s.chunk.header_ends
    if ends is not None:
        size += ends[s.hi] - ends[s.lo]
    return size


def _fitting(s: Slice, count: int, budget: int) -> int:
    """How many of a slice's first ``count`` records fit in ``budget`` bytes."""
    chunk, lo = s.chunk, s.lo
    hi = min(s.hi, lo + count)
    sizes: Iterable[int] = chunk.value_lengths[lo:hi]
    if chunk.key_lengths is not None:
        sizes = map(add, sizes, chunk.key_lengths[lo:hi])
    cumulative = list(accumulate(map(add, sizes, repeat(RECORD_OVERHEAD_BYTES))))
    if chunk.header_ends is not None:
        ends, base = chunk.header_ends, chunk.header_ends[lo]
        cumulative = [c + ends[lo + i + 1] - base for i, c in enumerate(cumulative)]
    return bisect_right(cumulative, budget)


def _candidates(part: Partition) -> Iterator[tuple[int, Key, Kind]]:
    """Lock held: the partition's buffered records in order, with what delivery would do
    with each (acks.PartitionAcks.deliver): first delivery, delivery again, or skip."""
    acks = part.acks
    first_new, cursor = acks.next_offset, acks.cursor
    for chunk in part.buffer:
        keys = _chunk_keys(part, chunk)
        for k in range(chunk.start, len(chunk)):
            offset, key = chunk.offsets[k], keys[k]
            if offset >= first_new:
                kind = Kind.NEW
            elif offset >= cursor and acks.is_due(offset):
                kind = Kind.DUE
            else:
                kind = Kind.SKIP
            yield offset, key, kind


@dataclass
class _Plan:
    """One take's look-ahead in one partition: its staged records, which of them are
    eligible (``mask``, by record, from the first staged), and how far the take walked:
    ``slices[pos]`` (perhaps what is left of one) starts at ``mask[at]``; ``kept`` holds
    what the walk passed over. Slices are split only where the walk goes."""

    slices: list[Slice]
    mask: list[bool]
    pos: int = 0
    at: int = 0
    kept: list[Slice] = field(default_factory=list)

    def left(self) -> list[Slice]:
        """The staged records not handed out, in order."""
        return self.kept + self.slices[self.pos :]

    def step(self, s: Slice, n: int) -> Slice:
        """The walk moves past the first ``n`` records of ``s`` (``slices[pos]``): they are
        returned as a slice, what is left of ``s`` stays at ``pos``."""
        self.at += n
        if n == len(s):
            self.pos += 1
            return s
        head, rest = s.pieces([(0, n, 1), (n, len(s), 1)])
        self.slices[self.pos] = rest
        return head


@dataclass
class _Taking:
    """One take from one partition: for whom, and until when its records are in flight."""

    part: Partition
    budget: _Budget
    holder: Holder
    due_at: float


@dataclass
class _Budget:
    """What one take may still hand out."""

    records: int
    bytes: int
    first: bool = True  # nothing taken yet

    def open(self) -> bool:
        return self.records > 0 and self.bytes > 0

    def spend(self, records: int, nbytes: int) -> None:
        self.records -= records
        self.bytes -= nbytes
        if records:
            self.first = False
