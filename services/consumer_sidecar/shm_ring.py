"""Where the next Arrow IPC stream goes in a Stream's shared-memory segment: a ring of
regions handed out in order and given back by the client, in any order.

``DELIVERY_FORMAT_ARROW_SHM`` writes each partition run once into the stream's segment
(``shm_segment.py``); the client reads it in place and releases its region with its ack.
The ring hands out space in allocation order, like a circular log: the free space is what
lies after the newest live region and before the oldest one. A released region is reused
once every region older than it is released too (the oldest live region is the ring's
tail), so one region the client holds back keeps the space after it until it is released.
Regions are never split, and one never wraps past the end of the segment: a region that
does not fit before the end starts again at 0 if the space there is free.

Pure: no I/O, no clock. Property-tested against a model (tests/unit/sidecar/test_shm_ring.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class Region:
    """Bytes [position, position + length) of the segment, handed out as ``id``."""

    id: int
    position: int
    length: int
    released: bool = False

    @property
    def end(self) -> int:
        return self.position + self.length


class Ring:
    """The regions of one segment of ``capacity`` bytes (see the module doc)."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be > 0")
        self.capacity = capacity
        self._live: deque[Region] = deque()  # oldest first
        self._by_id: dict[int, Region] = {}
        self._next_id = 1

    def __len__(self) -> int:
        """Regions handed out and not yet reusable (released ones behind a held one count)."""
        return len(self._live)

    @property
    def held(self) -> int:
        """Regions handed out and not released."""
        return len(self._by_id)

    def allocate(self, length: int) -> Region | None:
        """A region of ``length`` bytes, or None while there is no room for it (a region
        longer than the whole segment never fits: check :meth:`fits` first)."""
        if length <= 0:
            raise ValueError("a region holds at least one byte")
        position = self._room(length)
        if position is None:
            return None
        region = Region(self._next_id, position, length)
        self._next_id += 1
        self._live.append(region)
        self._by_id[region.id] = region
        return region

    def room(self) -> int:
        """The longest region :meth:`allocate` hands out now (0: none until a release)."""
        if not self._live:
            return self.capacity
        oldest, newest = self._live[0].position, self._live[-1].end
        if newest > oldest:
            return max(self.capacity - newest, oldest)
        return oldest - newest

    def fits(self, length: int) -> bool:
        """Whether a region of ``length`` bytes can ever be handed out."""
        return 0 < length <= self.capacity

    def release(self, region_id: int) -> bool:
        """The client is done with the region: whether it was handed out and still held
        (an unknown or already released id changes nothing)."""
        region = self._by_id.pop(region_id, None)
        if region is None:
            return False
        region.released = True
        while self._live and self._live[0].released:
            self._live.popleft()
        return True

    def _room(self, length: int) -> int | None:
        if not self._live:
            return 0 if length <= self.capacity else None
        oldest, newest = self._live[0].position, self._live[-1].end
        if newest > oldest:  # not wrapped: free after the newest, and before the oldest
            if self.capacity - newest >= length:
                return newest
            return 0 if oldest >= length else None
        # wrapped: free between the newest (near the start) and the oldest
        return newest if oldest - newest >= length else None
