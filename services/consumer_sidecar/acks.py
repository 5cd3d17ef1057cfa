"""Ack tracking: which offset of a partition may be committed (pure, no I/O).

Records are delivered in offset order but may be acked in any order. The commit point is
the lowest delivered-but-unacked offset, or one past the last delivered record when all
are acked — so a restart redelivers exactly what was delivered and not acknowledged
(ARCHITECTURE §3, "Delivery"). Offsets need not be contiguous (compaction, transaction
markers), so the tracker keeps the delivered offsets themselves, not a range.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class AckError(ValueError):
    """An ack that names an offset which was never delivered (or was already committed)."""


@dataclass
class PartitionAcks:
    """Delivered/acked bookkeeping for one partition under one lease epoch."""

    start: int  # the offset consumption started from (the committed offset at grant)
    # Offsets a previous owner had acked above its commit point (from the commit
    # metadata): they count as acked and are not delivered again.
    preacked: set[int] = field(default_factory=set)
    _pending: deque[int] = field(default_factory=deque)  # delivered offsets, ascending
    _acked: set[int] = field(default_factory=set)  # acked offsets still in _pending
    _next: int = -1  # one past the highest delivered offset
    version: int = 0  # bumped by every ack that changes what a commit would record

    def __post_init__(self) -> None:
        self._next = self.start

    @property
    def commit_point(self) -> int:
        """The offset to commit: lowest un-acked delivered offset, else next to deliver."""
        return self._pending[0] if self._pending else self._next

    @property
    def next_offset(self) -> int:
        """One past the highest delivered offset (where delivery continues)."""
        return self._next

    @property
    def inflight(self) -> int:
        """Delivered records not yet acked."""
        return len(self._pending) - len(self._acked)

    def delivered(self, offset: int) -> None:
        if offset < self._next:
            raise AckError(f"offset {offset} delivered out of order (next is {self._next})")
        self._pending.append(offset)
        self._next = offset + 1

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` acked; True if this moved the commit point.

        Acking an offset below the commit point is a harmless duplicate (already committed
        or acked); acking an offset never delivered is an error.
        """
        if offset < self.commit_point:
            return False
        if offset >= self._next:
            raise AckError(f"offset {offset} was not delivered (next is {self._next})")
        if offset in self._acked:
            return False
        self._acked.add(offset)
        self.version += 1
        return self._advance()

    def skip_preacked(self, offset: int) -> bool:
        """A fetched record a previous owner already acked: count it delivered and acked
        without handing it out. True if it was one."""
        if offset not in self.preacked or offset < self._next:
            return False
        self.preacked.discard(offset)
        self.delivered(offset)
        self._acked.add(offset)
        self.version += 1
        self._advance()
        return True

    def acked_above(self) -> list[int]:
        """Acked offsets above the commit point (what a commit's metadata must carry)."""
        return sorted(self._acked)

    def ack_all(self) -> None:
        """Auto-ack mode / drain: everything delivered counts as acked."""
        self._pending.clear()
        self._acked.clear()

    def unacked(self) -> list[int]:
        return [o for o in self._pending if o not in self._acked]

    def _advance(self) -> bool:
        moved = False
        while self._pending and self._pending[0] in self._acked:
            self._acked.discard(self._pending.popleft())
            moved = True
        return moved
