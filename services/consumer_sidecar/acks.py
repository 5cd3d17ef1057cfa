"""Ack tracking: which offset of a partition may be committed (pure, no I/O).

Records are delivered in offset order but may be acked in any order, one by one or by
offset range. The commit point is the lowest delivered-but-unacked offset, or one past the
last delivered record when all are acked — so a restart redelivers exactly what was
delivered and not acknowledged (ARCHITECTURE §3, "Delivery").

The tracker keeps only the delivered-but-unacked offsets, as sorted runs of consecutive
offsets ``[lo, hi)``: delivering a whole batch, acking a whole batch, and the commit point
are O(1) or O(log runs) whatever the batch size. Offsets need not be contiguous
(compaction, transaction markers): a gap is never part of a run, so it never holds the
commit point back, and acking a range that spans a gap simply skips it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable


class AckError(ValueError):
    """An ack that names an offset which was never delivered (or was already committed)."""


class PartitionAcks:
    """Delivered/acked bookkeeping for one partition under one lease epoch.

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
        # Delivered, not yet acked: disjoint runs [lo[i], hi[i]), ascending.
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._unacked = 0  # records in the runs
        self._next = start  # one past the highest delivered (or skipped) offset
        self.version = 0  # bumped by every ack that changes what a commit would record

    @property
    def commit_point(self) -> int:
        """The offset to commit: lowest un-acked delivered offset, else next to deliver."""
        return self._lo[0] if self._lo else self._next

    @property
    def next_offset(self) -> int:
        """One past the highest delivered offset (where delivery continues)."""
        return self._next

    @property
    def inflight(self) -> int:
        """Delivered records not yet acked."""
        return self._unacked

    def delivered(self, offset: int) -> None:
        self.delivered_run(offset, offset + 1)

    def delivered_run(self, lo: int, hi: int) -> None:
        """The records at every offset of [lo, hi) were delivered (in order)."""
        if lo < self._next:
            raise AckError(f"offset {lo} delivered out of order (next is {self._next})")
        if hi <= lo:
            return
        if self._hi and self._hi[-1] == lo:
            self._hi[-1] = hi
        else:
            self._lo.append(lo)
            self._hi.append(hi)
        self._unacked += hi - lo
        self._next = hi

    def delivered_offsets(self, offsets: Iterable[int]) -> None:
        """Records at these ascending (not necessarily consecutive) offsets were delivered."""
        run_lo = run_hi = -1
        for offset in offsets:
            if offset == run_hi:
                run_hi += 1
                continue
            if run_hi > run_lo:
                self.delivered_run(run_lo, run_hi)
            run_lo, run_hi = offset, offset + 1
        if run_hi > run_lo:
            self.delivered_run(run_lo, run_hi)

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` acked; True if this moved the commit point.

        Acking an offset below the commit point is a harmless duplicate (already committed
        or acked); acking an offset never delivered is an error.
        """
        if offset >= self._next:
            raise AckError(f"offset {offset} was not delivered (next is {self._next})")
        return self.ack_range(offset, offset + 1)

    def ack_range(self, lo: int, hi: int) -> bool:
        """Mark every delivered offset of [lo, hi) acked; True if the commit point moved.

        Offsets of the range that were not delivered because they hold no record, or that
        were acked already, are ignored; a range reaching past the last delivered offset is
        an error (nothing of it is applied)."""
        if hi <= lo:
            raise AckError(f"empty range [{lo}, {hi})")
        if hi > self._next:
            raise AckError(f"offsets up to {hi - 1} were not delivered (next is {self._next})")
        before = self.commit_point
        removed = self._remove(lo, hi)
        if removed:
            self.version += 1
        return self.commit_point != before

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
        self._next = offset + 1
        self.version += 1
        return True

    def acked_above(self) -> list[tuple[int, int]]:
        """Inclusive ranges above the commit point that hold no un-acked delivered record
        (what a commit's metadata must carry: acked records, and gaps that hold none)."""
        out: list[tuple[int, int]] = []
        for i in range(len(self._lo) - 1):
            out.append((self._hi[i], self._lo[i + 1] - 1))
        if self._lo and self._hi[-1] < self._next:
            out.append((self._hi[-1], self._next - 1))
        return out

    def ack_all(self) -> None:
        """Auto-ack mode / drain: everything delivered counts as acked."""
        if self._lo:
            self.version += 1
        self._lo.clear()
        self._hi.clear()
        self._unacked = 0

    def unacked(self) -> list[int]:
        return [o for lo, hi in zip(self._lo, self._hi, strict=True) for o in range(lo, hi)]

    def _remove(self, lo: int, hi: int) -> int:
        """Take [lo, hi) out of the un-acked runs; how many offsets were removed."""
        first = bisect_right(self._hi, lo)  # first run ending after lo
        last = bisect_left(self._lo, hi)  # runs [first, last) start before hi
        if first >= last:
            return 0
        removed = 0
        keep_lo: list[int] = []
        keep_hi: list[int] = []
        for i in range(first, last):
            run_lo, run_hi = self._lo[i], self._hi[i]
            removed += min(run_hi, hi) - max(run_lo, lo)
            if run_lo < lo:
                keep_lo.append(run_lo)
                keep_hi.append(lo)
            if run_hi > hi:
                keep_lo.append(hi)
                keep_hi.append(run_hi)
        self._lo[first:last] = keep_lo
        self._hi[first:last] = keep_hi
        self._unacked -= removed
        return removed
