"""Ack tracking and redelivery: what may be committed, and what is delivered again (pure).

Records are delivered in offset order but may be acked in any order, one by one or by
offset range. The commit point is the lowest delivered-but-unacked offset, or one past the
last delivered record when all are acked — so a restart redelivers exactly what was
delivered and not acknowledged (ARCHITECTURE §3, "Delivery").

One job, why whole (about 630 lines): one partition's delivery state, offset by offset, as
runs (acked, in flight, due, passed over) that every operation (deliver, ack, nack, expire,
release, the commit point) reads and rewrites together; split, each part would need the
others' invariants. Pure: property-tested against a model (tests/unit/sidecar/test_acks.py).

Nothing stays in flight forever. A delivered record is *in flight* until it is acked, or
until its ack deadline passes (the group's visibility timeout), its holder (the stream or
the client that received it) goes away, or the client nacks it: then it is *due*, and it
is delivered again. Due records keep holding the commit point back exactly like records in
flight. Each delivery of a record counts; a record that becomes due after ``limit``
deliveries is *given up* instead (the caller reports it as a ``POISON_RECORD`` and the
commit point may pass it). With a dead-letter topic (:attr:`PartitionAcks.park_given_up`)
a given-up record is *parked* instead: in flight to :data:`DEAD_LETTER` with no deadline,
it holds the commit point back until the caller has it on the dead-letter topic and acks
it (:mod:`dead_letter`), so it is never both lost and committed past.

The tracker keeps only offsets, never records: redelivery re-reads them from Kafka. The
*cursor* is where delivery continues: normally one past the highest offset ever handed out
(:attr:`next_offset`); when a record below the cursor becomes due, the caller rewinds
(:meth:`rewind`: the cursor goes back to the lowest due offset and the caller re-fetches
from there). While the cursor is below :attr:`next_offset`, a fetched record is handed out
only if it is due; records in flight elsewhere or acked are skipped. So for one partition:

* every delivery hands out records in offset order, and a record due again is handed out
  before any record above it is handed out for the first time;
* a due record that Kafka no longer has when it is re-read (compacted away) is dropped;
* acks are accepted from anyone for any delivered record (in flight or due): an ack is a
  fact about the record, not about who holds it. Nacks apply to the nacking client's own
  records only.

Records in flight and due records are kept as sorted runs of consecutive offsets
``[lo, hi)`` with their ack deadline, delivery count and holder: delivering a whole batch,
acking a whole batch and the commit point cost O(log runs) whatever the batch size.
Offsets need not be contiguous (compaction, transaction markers): a gap is never part of a
run, so it never holds the commit point back, and acking a range that spans a gap simply
skips it. The clock is a parameter of every call that needs one.

*Passed over* (``key`` ordering's look-ahead, :mod:`ordering`): records below
:attr:`PartitionAcks.next_offset` never delivered, because their key was held while later
records of other keys went out (:meth:`PartitionAcks.pass_over`). They are still in the
caller's buffer: not due, no holder, no deadline, no delivery counted. They hold the commit
point back like records in flight (so a commit never passes a record never delivered), an
ack range over them skips them (they were not delivered), and no timeout, nack or release
applies to them. Handing one out later (:meth:`PartitionAcks.deliver_passed`) is its first
delivery. When the caller drops its buffer (a rewind, a suspension, a revoke) they become
due (:meth:`PartitionAcks.unpass`), with no delivery counted, and are re-read like due ones;
until delivered, an ack range over them still skips them (nobody received them).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from operator import attrgetter
from typing import TypeAlias

# Who received records: (client id, stream id), stream id 0 for Fetch. A nack names its
# client; a stream that ends releases what it received.
Holder = tuple[str, int]
NO_HOLDER: Holder = ("", 0)
# The holder of parked records (given up, on their way to the dead-letter topic): no
# client id can be empty, so no client's nack or ack binding ever names it.
DEAD_LETTER: Holder = ("", -1)
# The holder of passed-over records (ordering key, issue 39): never delivered, still in the
# caller's buffer, held back by their key while later records of other keys went out.
PASSED: Holder = ("", -2)
NO_LIMIT = 0  # deliveries limit: never give a record up
DUE = -math.inf  # a run's ack deadline once it is due

_HI = attrgetter("hi")
_ANYONE = (NO_HOLDER, DEAD_LETTER)  # holders whose records anyone may ack


class AckError(ValueError):
    """An ack that names an offset which was never delivered (or was already committed)."""


class NotHolderError(AckError):
    """An ack from a client for a record in flight to another client (nothing applied)."""


@dataclass(frozen=True)
class GivenUp:
    """Records [lo, hi) that became due after ``deliveries`` deliveries (the limit), last
    held by ``holder``; ``parked``: kept in flight to :data:`DEAD_LETTER` until acked."""

    lo: int
    hi: int
    deliveries: int
    holder: Holder = NO_HOLDER
    parked: bool = False


@dataclass(frozen=True, slots=True)
class _Run:
    """Records at every offset of [lo, hi): in flight until ``due_at`` (``DUE``: due now)."""

    lo: int
    hi: int
    deliveries: int
    due_at: float
    holder: Holder

    @property
    def due(self) -> bool:
        return self.due_at == DUE

    @property
    def passed(self) -> bool:
        return self.holder is PASSED  # the one object: runs are made with it or replaced


_Which: TypeAlias = Callable[[_Run], bool]  # which runs an operation applies to
_Change: TypeAlias = Callable[[_Run], "_Run | None"]  # a run's new state (None: gone)


class PartitionAcks:
    """Delivered/acked/due bookkeeping for one partition under one lease epoch.

    ``start`` is the offset consumption started from (the committed offset at grant); < 0
    means "not known yet" (kafka_group mode): the first delivered record sets the commit
    point. ``preacked`` are inclusive offset ranges a previous owner had acked above its
    commit point (from the commit metadata): they count as acked and are not delivered again.
    """

    def __init__(self, start: int, preacked: Iterable[tuple[int, int]] = ()) -> None:
        self.start = start
        ranges = sorted((lo, hi + 1) for lo, hi in preacked if hi >= lo and hi >= start)
        self._pre_lo = [lo for lo, _ in ranges]
        self._pre_hi = [hi for _, hi in ranges]
        self._runs: list[_Run] = []  # in flight or due: disjoint, ascending
        self._inflight = 0  # records in flight
        self._due = 0  # records due
        self._passed = 0  # records passed over (never delivered, below _next)
        self._next = start  # one past the highest delivered (or skipped) offset
        self._cursor = start  # where delivery continues (< _next while re-reading)
        self.version = 0  # bumped by every ack that changes what a commit would record
        # Given-up records are parked for the dead-letter topic (the group has one).
        self.park_given_up = False

    # ---- reading ----------------------------------------------------------------------

    @property
    def commit_point(self) -> int:
        """The offset to commit: lowest un-acked delivered offset, else next to deliver."""
        return self._runs[0].lo if self._runs else self._next

    @property
    def next_offset(self) -> int:
        """One past the highest delivered offset (where first deliveries continue)."""
        return self._next

    @property
    def cursor(self) -> int:
        """Where delivery continues; below :attr:`next_offset` while due records are re-read."""
        return self._cursor

    @property
    def inflight(self) -> int:
        """Delivered records not yet acked and not due."""
        return self._inflight

    @property
    def due(self) -> int:
        """Records waiting to be delivered again."""
        return self._due

    @property
    def passed(self) -> int:
        """Records passed over: never delivered, below :attr:`next_offset`."""
        return self._passed

    def unacked(self) -> list[int]:
        """Every delivered record not acked (in flight or due), ascending."""
        return [o for run in self._runs if not run.passed for o in range(run.lo, run.hi)]

    def unacked_runs(self) -> list[tuple[int, int, bool]]:
        """Delivered records not acked as runs (lo, hi, due), ascending; parked records
        count as in flight (not due); passed-over records are not delivered: not there."""
        if not self._passed:
            return [(run.lo, run.hi, run.due_at == DUE) for run in self._runs]
        return [(r.lo, r.hi, r.due_at == DUE) for r in self._runs if r.holder is not PASSED]

    def passed_runs(self) -> list[tuple[int, int]]:
        """The passed-over records as runs (lo, hi), ascending."""
        return [(run.lo, run.hi) for run in self._runs if run.passed] if self._passed else []

    def deliveries_of(self, offset: int) -> int:
        """How often the un-acked record at ``offset`` was delivered (0: not un-acked)."""
        run = self._run_at(offset)
        return run.deliveries if run is not None else 0

    def is_due(self, offset: int) -> bool:
        run = self._run_at(offset)
        return run is not None and run.due

    def holder_of(self, offset: int) -> Holder | None:
        """Who holds the record in flight at ``offset`` (None: not in flight)."""
        run = self._run_at(offset)
        return run.holder if run is not None and not run.due and not run.passed else None

    def next_deadline(self) -> float:
        """The earliest ack deadline of a record in flight (inf: none)."""
        return min((r.due_at for r in self._runs if not r.due and not r.passed), default=math.inf)

    def acked_above(self) -> list[tuple[int, int]]:
        """Inclusive ranges above the commit point that hold no un-acked delivered record
        (what a commit's metadata must carry: acked records, and gaps that hold none)."""
        runs = self._runs
        out = [(a.hi, b.lo - 1) for a, b in pairwise(runs) if b.lo > a.hi]
        if runs and runs[-1].hi < self._next:
            out.append((runs[-1].hi, self._next - 1))
        return out

    # ---- delivery ---------------------------------------------------------------------

    def plain(self, first: int, last: int) -> bool:
        """Whether the records at ``first``..``last`` are all first deliveries with nothing
        to skip (no re-read in progress, nothing a previous owner acked there): the fast
        path of :meth:`delivered_run` / :meth:`delivered_offsets` applies."""
        return (
            self._cursor == self._next
            and first >= self._next
            and not self.preacked_within(first, last + 1)
        )

    def delivered(self, offset: int) -> None:
        self.delivered_run(offset, offset + 1)

    def delivered_run(
        self, lo: int, hi: int, due_at: float = math.inf, holder: Holder = NO_HOLDER
    ) -> None:
        """The records at every offset of [lo, hi) were delivered for the first time (in
        order), in flight until ``due_at``."""
        if lo < self._next:
            raise AckError(f"offset {lo} delivered out of order (next is {self._next})")
        if hi <= lo:
            return
        runs = self._runs
        last = runs[-1] if runs else None
        if (
            last is not None
            and last.hi == lo
            and (last.deliveries, last.due_at, last.holder) == (1, due_at, holder)
        ):
            runs[-1] = replace(last, hi=hi)
        else:
            runs.append(_Run(lo, hi, 1, due_at, holder))
        self._inflight += hi - lo
        self._next = self._cursor = hi

    def delivered_offsets(
        self, offsets: Iterable[int], due_at: float = math.inf, holder: Holder = NO_HOLDER
    ) -> None:
        """Records at these ascending (not necessarily consecutive) offsets were delivered."""
        for lo, hi in _runs_of(offsets):
            self.delivered_run(lo, hi, due_at, holder)

    def deliver(
        self, offsets: Sequence[int], due_at: float, holder: Holder
    ) -> list[tuple[int, int, int]]:
        """Fetched records at these ascending offsets are taken for delivery: mark what is
        handed out in flight until ``due_at`` with ``holder``. Returns the parts of
        ``offsets`` to hand out as (first index, end index, delivery count), ascending;
        the rest are skipped (below the cursor, in flight elsewhere, acked here or by a
        previous owner)."""
        n = len(offsets)
        i = bisect_left(offsets, self._cursor)
        out: list[tuple[int, int, int]] = []
        if i < n and self._cursor < self._next:
            i = self._redeliver(offsets, i, due_at, holder, out)
        if i < n:
            self._first_deliveries(offsets, i, due_at, holder, out)
        return out

    def _redeliver(
        self,
        offsets: Sequence[int],
        i: int,
        due_at: float,
        holder: Holder,
        out: list[tuple[int, int, int]],
    ) -> int:
        """The re-read part of ``offsets`` (from index ``i``, below :attr:`next_offset`):
        due records are handed out again, due offsets the re-read passed without finding
        them are dropped (Kafka no longer has them). Returns the index of the first offset
        at or above next_offset."""
        end = min(offsets[-1] + 1, self._next)  # the re-read covers [cursor, end)
        j = bisect_left(offsets, end, lo=i)
        for run in [r for r in self._overlapping(self._cursor, end) if r.due]:
            a, b = max(run.lo, self._cursor), min(run.hi, end)
            ia, ib = bisect_left(offsets, a, lo=i, hi=j), bisect_left(offsets, b, lo=i, hi=j)
            found = list(_runs_of(offsets[k] for k in range(ia, ib)))
            self._replace(a, b, [_Run(x, y, run.deliveries + 1, due_at, holder) for x, y in found])
            self._due -= b - a
            self._inflight += ib - ia
            if ib > ia:
                out.append((ia, ib, run.deliveries + 1))
        self._cursor = end
        return j

    def _first_deliveries(
        self,
        offsets: Sequence[int],
        i: int,
        due_at: float,
        holder: Holder,
        out: list[tuple[int, int, int]],
    ) -> None:
        """Offsets from index ``i`` on, all at or above next_offset: delivered for the first
        time, except those a previous owner acked (skipped)."""
        n = len(offsets)
        if not self._pre_lo or not self.preacked_within(offsets[i], offsets[-1] + 1):
            self.delivered_offsets((offsets[k] for k in range(i, n)), due_at, holder)
            out.append((i, n, 1))
            return
        start = None
        for k in range(i, n):
            offset = offsets[k]
            if self.skip_preacked(offset):
                if start is not None:
                    out.append((start, k, 1))
                    start = None
                continue
            self.delivered_run(offset, offset + 1, due_at, holder)
            if start is None:
                start = k
        if start is not None:
            out.append((start, n, 1))

    def preacked_within(self, lo: int, hi: int) -> bool:
        """Whether a previous owner acked any offset of [lo, hi) that is still to deliver."""
        if not self._pre_lo:
            return False
        while self._pre_hi and self._pre_hi[0] <= self._next:
            del self._pre_lo[0], self._pre_hi[0]  # behind delivery: never asked again
        i = bisect_right(self._pre_hi, lo)
        return i < len(self._pre_lo) and self._pre_lo[i] < hi

    def skip_preacked(self, offset: int) -> bool:
        """A fetched record a previous owner already acked: count it delivered and acked
        without handing it out. True if it was one."""
        if offset < self._next or not self.preacked_within(offset, offset + 1):
            return False
        self._next = self._cursor = offset + 1
        self.version += 1
        return True

    def pass_over(self, offsets: Sequence[int]) -> None:
        """Fetched records at these ascending offsets (all at or above :attr:`next_offset`,
        no re-read in progress) are passed over: later records go out before them. Those a
        previous owner acked count as delivered and acked (nothing to pass)."""
        if not offsets:
            return
        if offsets[0] < self._next or self._cursor != self._next:
            raise AckError(f"offset {offsets[0]} passed over out of order (next is {self._next})")
        for lo, hi in _runs_of(offsets):
            if self._pre_lo and self.preacked_within(lo, hi):
                for offset in range(lo, hi):
                    if not self.skip_preacked(offset):
                        self._runs.append(_Run(offset, offset + 1, 0, math.inf, PASSED))
                        self._passed += 1
                        self._next = self._cursor = offset + 1
                continue
            self._runs.append(_Run(lo, hi, 0, math.inf, PASSED))
            self._passed += hi - lo
            self._next = self._cursor = hi

    def deliver_passed(
        self, lo: int, hi: int, due_at: float = math.inf, holder: Holder = NO_HOLDER
    ) -> int:
        """The passed-over records of [lo, hi) are delivered (their first delivery), in
        flight until ``due_at``; how many there were."""
        moved = 0

        def delivered(run: _Run) -> _Run:
            nonlocal moved
            if not run.passed:
                return run
            moved += run.hi - run.lo
            return replace(run, deliveries=1, due_at=due_at, holder=holder)

        self._update(lo, hi, delivered, count=False)
        self._passed -= moved
        self._inflight += moved
        return moved

    def unpass(self) -> int:
        """The caller dropped its buffer: the passed-over records are due (no delivery
        counted), to be re-read from Kafka (:meth:`refetch_from`); how many there were."""
        if not self._passed:
            return 0
        count = self._passed

        def due(run: _Run) -> _Run:
            return replace(run, due_at=DUE, holder=NO_HOLDER) if run.passed else run

        self._update(self._runs[0].lo, self._next, due, count=False)
        self._due += count
        self._passed = 0
        return count

    # ---- acks -------------------------------------------------------------------------

    def ack(self, offset: int, client: str | None = None) -> bool:
        """Mark ``offset`` acked; True if this moved the commit point.

        Acking an offset below the commit point is a harmless duplicate (already committed
        or acked); acking an offset never delivered is an error, and so is acking, as
        ``client``, a record in flight to another client (:meth:`ack_range`).
        """
        if offset >= self._next:
            raise AckError(f"offset {offset} was not delivered (next is {self._next})")
        return self.ack_range(offset, offset + 1, client)

    def ack_range(self, lo: int, hi: int, client: str | None = None) -> bool:
        """Mark every delivered offset of [lo, hi) acked, in flight or due; True if the
        commit point moved.

        Offsets of the range that were not delivered because they hold no record, or that
        were acked already, are ignored; a range reaching past the last delivered offset is
        an error (nothing of it is applied). With ``client``, a range that covers a record
        in flight to another client is refused whole (:class:`NotHolderError`): acks are
        bound to the client the records were delivered to; a due record (its deadline
        passed, its holder gone, nacked) may be acked by anyone."""
        if hi <= lo:
            raise AckError(f"empty range [{lo}, {hi})")
        if hi > self._next:
            raise AckError(f"offsets up to {hi - 1} were not delivered (next is {self._next})")
        if client is not None:
            for run in self._overlapping(lo, hi):
                if (
                    not run.due
                    and not run.passed
                    and run.holder not in _ANYONE
                    and run.holder[0] != client
                ):
                    first = max(lo, run.lo)
                    raise NotHolderError(
                        f"offset {first} is in flight to another client of the group; "
                        "only the client it was delivered to may ack it before its ack "
                        "deadline"
                    )
        before = self.commit_point
        removed = self._update(lo, hi, _acked)
        if removed:
            self.version += 1
        return self.commit_point != before

    def ack_all(self) -> None:
        """kafka_group drain: everything delivered counts as acked (due records included)."""
        if self._runs:
            self.version += 1
        # never delivered (passed over, or due since): kept, they hold the commit point
        self._runs = [run for run in self._runs if run.deliveries == 0]
        self._inflight = 0
        self._due = sum(run.hi - run.lo for run in self._runs if run.due)
        self._cursor = self._next

    # ---- redelivery -------------------------------------------------------------------

    def expire(self, now: float, limit: int = NO_LIMIT) -> list[GivenUp]:
        """Records whose ack deadline passed by ``now`` become due (or are given up past
        ``limit`` deliveries)."""
        if self.next_deadline() > now:
            return []
        return self._make_due(self.start, self._next, limit, lambda r: r.due_at <= now)

    def release(self, holder: Holder, limit: int = NO_LIMIT) -> list[GivenUp]:
        """``holder`` went away (its stream ended): what it has in flight becomes due."""
        return self._make_due(self.start, self._next, limit, lambda r: r.holder == holder)

    def nack(
        self,
        lo: int,
        hi: int,
        client: str,
        now: float,
        delay: float = 0.0,
        limit: int = NO_LIMIT,
    ) -> tuple[int, list[GivenUp]]:
        """``client`` asks for its records of [lo, hi) in flight to be delivered again,
        after ``delay`` seconds (0: now). Returns how many records that concerned, and what
        was given up; records of other clients, and acked or due ones, are left alone."""
        if hi <= lo:
            raise AckError(f"empty range [{lo}, {hi})")
        if hi > self._next:
            raise AckError(f"offsets up to {hi - 1} were not delivered (next is {self._next})")
        mine = [r for r in self._overlapping(lo, hi) if not r.due and r.holder[0] == client]
        count = sum(min(r.hi, hi) - max(r.lo, lo) for r in mine)
        if not mine:
            return 0, []
        if delay > 0:
            later = now + delay
            self._update(
                lo,
                hi,
                lambda r: replace(r, due_at=later) if not r.due and r.holder[0] == client else r,
            )
            return count, []
        return count, self._make_due(lo, hi, limit, lambda r: r.holder[0] == client)

    def redeliver(self, lo: int, hi: int, limit: int = NO_LIMIT) -> list[GivenUp]:
        """Records of [lo, hi) in flight were never received (their response was not
        sent): due now, whoever holds them."""
        return self._make_due(lo, min(hi, self._next), limit, lambda r: True)

    def refetch_from(self) -> int | None:
        """The lowest due offset when it lies below the cursor: fetching must go back
        there (:meth:`rewind`) before anything more of this partition is delivered."""
        for run in self._runs:
            if run.lo >= self._cursor:
                return None
            if run.due:
                return run.lo
        return None

    def rewind(self) -> int:
        """Move the cursor back to the lowest due offset below it; returns where fetching
        must continue from (the cursor)."""
        due = self.refetch_from()
        if due is not None:
            self._cursor = due
        return self._cursor

    def _make_due(self, lo: int, hi: int, limit: int, which: _Which) -> list[GivenUp]:
        """In-flight runs of [lo, hi) chosen by ``which`` become due, or are given up (as
        if acked) when they were delivered ``limit`` times already."""
        given_up: list[GivenUp] = []

        def due(run: _Run) -> _Run | None:
            if run.due or run.passed or not which(run):
                return run
            self._inflight -= run.hi - run.lo
            if limit != NO_LIMIT and run.deliveries >= limit:
                parked = self.park_given_up
                given_up.append(GivenUp(run.lo, run.hi, run.deliveries, run.holder, parked))
                if parked:  # held back, never due, until the dead-letter topic has it
                    self._inflight += run.hi - run.lo
                    return replace(run, due_at=math.inf, holder=DEAD_LETTER)
                return None
            self._due += run.hi - run.lo
            return replace(run, due_at=DUE, holder=NO_HOLDER)

        self._update(lo, hi, due, count=False)
        if given_up:
            self.version += 1
        return given_up

    # ---- runs -------------------------------------------------------------------------

    def _run_at(self, offset: int) -> _Run | None:
        i = bisect_right(self._runs, offset, key=_HI)
        if i < len(self._runs) and self._runs[i].lo <= offset:
            return self._runs[i]
        return None

    def _overlapping(self, lo: int, hi: int) -> list[_Run]:
        first = bisect_right(self._runs, lo, key=_HI)
        out = []
        for run in self._runs[first:]:
            if run.lo >= hi:
                break
            out.append(run)
        return out

    def _update(self, lo: int, hi: int, change: _Change, *, count: bool = True) -> int:
        """Apply ``change`` to the parts of the runs within [lo, hi) (a run sticking out is
        split first); ``None`` removes a part. With ``count``, removed parts leave the in
        flight and due counts. Returns how many offsets were removed."""
        runs = self._runs
        first = bisect_right(runs, lo, key=_HI)  # first run ending after lo
        last = bisect_left(runs, hi, key=attrgetter("lo"))  # runs [first, last) start before hi
        if first >= last:
            return 0
        removed = 0
        out: list[_Run] = []
        for run in runs[first:last]:
            if run.lo < lo:
                out.append(replace(run, hi=lo))
            # A run wholly inside [lo, hi) (an ack of a whole batch) is changed as it is:
            # no copy (dataclasses.replace was 3 % of the event loop at 100 records/s).
            inner = (
                run
                if lo <= run.lo and run.hi <= hi
                else replace(run, lo=max(run.lo, lo), hi=min(run.hi, hi))
            )
            changed = change(inner)
            if changed is None:
                size = inner.hi - inner.lo
                removed += size
                if count:
                    if inner.due:
                        self._due -= size
                    else:
                        self._inflight -= size
            else:
                out.append(changed)
            if run.hi > hi:
                out.append(replace(run, lo=hi))
        runs[first:last] = out
        return removed

    def _replace(self, lo: int, hi: int, new: list[_Run]) -> None:
        """Put ``new`` (runs within [lo, hi)) where the runs of [lo, hi) were."""
        runs = self._runs
        first = bisect_right(runs, lo, key=_HI)
        last = bisect_left(runs, hi, key=attrgetter("lo"))
        head = [replace(runs[first], hi=lo)] if first < last and runs[first].lo < lo else []
        tail = [replace(runs[last - 1], lo=hi)] if first < last and runs[last - 1].hi > hi else []
        runs[first:last] = head + new + tail


def _acked(run: _Run) -> _Run | None:
    """An ack's change: a delivered record goes; one never delivered (passed over, or due
    since it was: no delivery counted) stays."""
    return run if run.deliveries == 0 else None


def _runs_of(offsets: Iterable[int]) -> Iterable[tuple[int, int]]:
    """Ascending offsets as runs [lo, hi) of consecutive ones."""
    lo = hi = None
    for offset in offsets:
        if offset == hi:
            hi += 1
            continue
        if lo is not None and hi is not None:
            yield lo, hi
        lo, hi = offset, offset + 1
    if lo is not None and hi is not None:
        yield lo, hi
