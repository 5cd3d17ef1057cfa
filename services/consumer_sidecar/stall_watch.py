"""Noticing that this sidecar itself was away: stopped (SIGSTOP), frozen with its container
or VM, or starved of CPU for longer than its leases can outlast.

Under ``commit_fencing: kafka`` a confirmed lease has no local deadline (leasing.py): it
runs on while no assigner is reachable, and Kafka refuses the commits of a holder the next
one fenced. That protects the committed offsets, not the deliveries: a sidecar that wakes
up after its leases moved would hand its clients the records behind its stale fetch
position, which the new holder has already delivered and had acked (CI, 2 Dec: 351 such
records from a zombie SIGSTOPped for 8.5 s). A lease can only have moved while this
process was away for longer than the assigner's TTL less a heartbeat interval, and such an
absence is visible from inside: the fetch thread runs at least every poll timeout (a few
hundred ms, idle or not) and every delivery looks at the clock, so a gap between two of
those longer than :func:`stall_limit_for` is a stall. After one, every Kafka-fenced lease
is *unverified*: nothing of it is delivered until a commit through its transactional
producer, made after the stall was seen, succeeds (the lease is still this sidecar's) or is
fenced (it moved: dropped, as any fenced lease). Leases with a local deadline need none of
this: a stall past their deadline suspends them.

A false alarm (a fetch thread blocked in a slow Kafka call while no client reads) costs one
commit round trip of delay, nothing else. Pure logic; :class:`PartitionTable` holds it.
The fetch thread tells it the process runs on every turn of its loop: :meth:`StallWatch.
running` answers that common case without the table's lock (a plain float store; the
deliveries and acks of the event loop contend for that lock), and only a gap past the
limit goes to :meth:`StallWatch.seen` under it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def stall_limit_for(ttl: float, heartbeat_interval: float) -> float:
    """The longest absence after which every lease is surely still ours: a lease was last
    renewed at most a heartbeat interval before the absence began, and the assigner takes
    it no sooner than its TTL after that renewal. Half of that, for safety (a loaded
    machine delays the fetch thread too; a false alarm is cheap), never below 0.2 s."""
    return max(0.2, (ttl - heartbeat_interval) / 2)


@dataclass
class StallWatch:
    """When the process was last seen running, and how many stalls it noticed."""

    limit: float = math.inf  # seconds; inf until the session learns the group's TTL
    alive_at: float = -math.inf
    stalls: int = 0  # each stall's number marks the leases it left unverified

    def running(self, now: float) -> bool:
        """The process runs at ``now`` and nothing says it was away: recorded, True. False
        (nothing recorded) when the gap may be a stall: then :meth:`seen` decides, under
        the table's lock. Safe without a lock: two threads racing here can at worst store
        the earlier of two clock readings, which only makes a later gap look longer (a
        false alarm, cheap), never shorter."""
        alive_at = self.alive_at
        if now - alive_at > self.limit or not math.isfinite(alive_at):
            return False
        if now > alive_at:
            self.alive_at = now
        return True

    def seen(self, now: float) -> float | None:
        """The process runs at ``now``: the length of the absence that ended, if it was a
        stall (counted), else None."""
        gap = now - self.alive_at
        self.alive_at = max(self.alive_at, now)
        if gap > self.limit and math.isfinite(gap):
            self.stalls += 1
            return gap
        return None
