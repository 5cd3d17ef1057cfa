"""Not-fetching gaps per partition: since when a held partition that had records to fetch
(or could not tell, its leader out of reach) got none from Kafka (pure: no I/O, no clock,
no threads; the caller passes the time and keeps it on one lock).

The figure answers ARCHITECTURE §2's "stale leaders": how long a partition was not
fetching across a leader move, an outage or a handoff. Exported as
``ds_partition_not_fetching_seconds`` (a histogram of completed gaps) and
``ds_partition_not_fetching_current_seconds`` (the gap open now, 0 while fetching).

**Definition.** A held partition *wants records* (:func:`wants_records`) when the sidecar
means to fetch it (neither backpressure nor a suspended lease pauses it on purpose: those
are other figures, CLIENT_BACKPRESSURE and the lease metrics) and either

* its fetch position is below its high watermark (records wait in the log), or
* librdkafka cannot fetch it: no leader known, the leader's connection not up, or the
  partition's fetch state not ``active``; its log end is then unknown, so records may
  wait, and a leader that is gone is exactly what the figure is for.

A partition at its known end with a reachable leader is *not* "not fetching", however long
nothing arrives. Evidence of fetching is a record fetched for it, or a look that found it
not wanting records. A gap is the time from the last evidence to the next, counted when
the partition wanted records meanwhile and the gap lasted at least ``floor`` seconds
(:data:`GAP_FLOOR_SECONDS`): below that it is the ordinary wait between two Fetch
responses. A partition released while in a gap ends the gap there. A newly granted partition's
stretch starts at the grant: the time its fetching takes to set up is part of a gap when
the statistics show it behind before its first records arrive (a slow handoff).

Wanting is judged from librdkafka's statistics (emitted every ``statistics.interval.ms``),
and what they show counts as of when they were emitted (:meth:`GapTracker.look`'s ``at``):
a dead leader shows in the gauge at the first statistics after it died, but the gap is
measured from the last record fetched, so its length does not depend on the interval.
Paused on purpose counts as of the moment it is seen.

**Handoff gaps** (:class:`HandoffGaps`, ``ds_sidecar_handoff_gap_seconds``). A lease
handoff's gap is mostly shorter than the floor (the new owner's fetching is set up and its
first Fetch answered within a second), so the histogram above does not see it. It is its
own figure, counted whatever its length: from the grant (or a ``kafka_group`` assignment)
of a partition until its first records arrive, when those records waited for the new
owner, i.e. the first of them was written before the grant (its timestamp not after the
grant's wall time: a record written later was not waiting and its wait is no gap; records
without a timestamp count as waiting) and no look after the grant found the partition at
its end or paused on purpose (then nothing was waiting, or not fetching was meant). A
partition released before its first records ends its handoff uncounted. A handoff of a
second or more is also a ``ds_partition_not_fetching_seconds`` gap when the statistics saw
the partition behind meanwhile.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# librdkafka's Fetch waits up to fetch.wait.max.ms (100 ms by default here) for records,
# and a partition behind its end gets records at every response: a second without any
# is not the ordinary wait between two responses.
GAP_FLOOR_SECONDS = 1.0
FETCH_ACTIVE = "active"  # librdkafka's fetch_state of a partition it fetches
BROKER_UP = "UP"  # librdkafka's state of a broker connection that serves requests


def wants_records(
    *,
    position: int,
    high_watermark: int,
    leader: int,
    leader_state: str | None,
    fetch_state: str,
) -> bool:
    """Whether a partition the sidecar means to fetch has records to fetch, or cannot
    tell because librdkafka cannot fetch it (see the module doc). ``leader`` is -1 when
    unknown; ``leader_state`` the state of that broker's connection (None when librdkafka
    lists no such broker); ``high_watermark`` -1 when unknown."""
    if leader < 0 or leader_state != BROKER_UP or fetch_state != FETCH_ACTIVE:
        return True
    return 0 <= position < high_watermark


@dataclass
class _Stretch:
    since: float  # the last evidence of fetching (or when the partition was first held)
    wanting: bool = False  # the last look found it wanting records


class GapTracker(Generic[K]):
    """Per held partition key: the stretch since its last evidence of fetching, and
    whether it wants records. Each method that can end a gap returns its length
    (seconds), else None. Not thread-safe."""

    def __init__(self, floor: float = GAP_FLOOR_SECONDS) -> None:
        self.floor = floor
        self._stretches: dict[K, _Stretch] = {}

    def _gap(self, stretch: _Stretch, at: float) -> float | None:
        length = at - stretch.since
        return length if stretch.wanting and length >= self.floor else None

    def held(self, keys: Iterable[K], now: float) -> list[tuple[K, float]]:
        """The keys held at ``now``: a new one starts its stretch there; one no longer
        held is forgotten, and the gap it was in ends at ``now`` (returned as (key,
        length))."""
        kept = set(keys)
        ended = []
        for key in [k for k in self._stretches if k not in kept]:
            gap = self._gap(self._stretches.pop(key), now)
            if gap is not None:
                ended.append((key, gap))
        for key in kept:
            if key not in self._stretches:
                self._stretches[key] = _Stretch(now)
        return ended

    def fetched(self, key: K, now: float) -> float | None:
        """Records of ``key`` arrived at ``now``: the gap open, if any, ends."""
        stretch = self._stretches.get(key)
        if stretch is None:
            self._stretches[key] = _Stretch(now)
            return None
        gap = self._gap(stretch, now)
        stretch.since = max(stretch.since, now)
        return gap

    def look(self, key: K, at: float, wanting: bool) -> float | None:
        """What was known of ``key`` at ``at`` (the time of the information, which may be
        older than now: statistics): wanting records keeps the stretch open; not wanting
        is evidence of fetching at ``at``, and the gap open, if any, ends there."""
        stretch = self._stretches.setdefault(key, _Stretch(at))
        if wanting:
            stretch.wanting = True
            return None
        gap = self._gap(stretch, at)
        stretch.since, stretch.wanting = max(stretch.since, at), False
        return gap

    def current(self, key: K, now: float) -> float:
        """The gap of ``key`` open at ``now`` (0.0 when fetching or not held)."""
        stretch = self._stretches.get(key)
        if stretch is None:
            return 0.0
        return self._gap(stretch, now) or 0.0

    def __contains__(self, key: object) -> bool:
        return key in self._stretches


class HandoffGaps(Generic[K]):
    """Per held partition key, the handoff open since its grant (see the module doc).
    A grant is told apart by its time: the same key with a new grant time is a new
    handoff. Not thread-safe."""

    def __init__(self) -> None:
        self._granted: dict[K, float] = {}  # the grant time of the current holding
        self._open: dict[K, float] = {}  # keys whose first records have not come yet

    def _grant(self, key: K, granted_at: float) -> None:
        if self._granted.get(key) != granted_at:
            self._granted[key] = granted_at
            self._open[key] = granted_at

    def held(self, grants: Iterable[tuple[K, float]]) -> None:
        """The keys held now with their grant times: a new grant opens a handoff; a key
        no longer held is forgotten, an open handoff of it uncounted."""
        kept = dict(grants)
        for key in [k for k in self._granted if k not in kept]:
            del self._granted[key]
            self._open.pop(key, None)
        for key, granted_at in kept.items():
            self._grant(key, granted_at)

    def fetched(self, key: K, at: float, granted_at: float, waited: bool) -> float | None:
        """The records of ``key`` fetched at ``at`` (its grant at ``granted_at``);
        ``waited``: the first of them was written before the grant. The handoff's gap
        when these are its first records and they waited, else None."""
        self._grant(key, granted_at)
        since = self._open.pop(key, None)
        if since is None or not waited:
            return None
        return max(0.0, at - since)

    def idle(self, key: K, at: float) -> None:
        """A look at ``at`` found ``key`` at its end or paused on purpose: a handoff open
        since before ``at`` ends uncounted (nothing was waiting, or not fetching was
        meant)."""
        since = self._open.get(key)
        if since is not None and at >= since:
            del self._open[key]
