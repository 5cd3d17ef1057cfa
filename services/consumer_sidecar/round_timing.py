"""Timing of group membership rounds for the coordinator metrics (join, sync, lost; the
Java consumer's ``consumer-coordinator-metrics``). Pure: the clock is passed in; the
session (leased mode) and
:class:`~services.consumer_sidecar.kafka_group_membership.ClassicMembership`
(``kafka_group`` mode) tell a :class:`RoundTimer` what happened and report what it returns
to the metrics (:mod:`services.consumer_sidecar.metrics`).

A round is: started (leased: the session's Join sent; kafka_group: ``subscribe()``, or the
``on_revoke`` / ``on_lost`` that ended the previous round) → joined (SessionAccepted;
``on_assign``) → its first assignment (leased: the session's first grant). A round that
ends before it joined is a failed join.
"""

from __future__ import annotations

from collections.abc import Callable


class RoundTimer:
    """One member's rounds, one at a time. Not thread-safe: one thread (or the event
    loop) tells it everything."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started: float | None = None  # a round under way, not joined yet
        self._joined: float | None = None  # joined, its first assignment not seen yet

    @property
    def pending(self) -> bool:
        """A round started and not joined yet."""
        return self._started is not None

    def start(self) -> None:
        """A new round begins now (a Join sent): whatever was under way is over."""
        self._started = self._clock()
        self._joined = None

    def start_unless_pending(self) -> None:
        """A sign that a round is under way (a revoke): its start, unless one is known."""
        if self._started is None:
            self.start()

    def joined(self) -> float | None:
        """The round joined: seconds since its start, or None when its start was not
        seen (a rebalance another member began)."""
        now = self._clock()
        started, self._started = self._started, None
        self._joined = now
        return None if started is None else max(0.0, now - started)

    def assigned(self) -> float | None:
        """The round's first assignment arrived: seconds since it joined, once per round
        (None for any later one, or before a join)."""
        joined, self._joined = self._joined, None
        return None if joined is None else max(0.0, self._clock() - joined)

    def failed(self) -> bool:
        """The round ended (the session broke): True if it had not joined, a failed
        join. Forgets the round either way."""
        failed = self._started is not None
        self._started = None
        self._joined = None
        return failed


def lost_latency(deadline: float, now: float) -> float:
    """A lease expiry's latency: from the lease's local deadline until ``now``, when its
    delivery and commits stopped (never negative: a deadline just reached is 0)."""
    return max(0.0, now - deadline)
