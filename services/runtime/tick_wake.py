"""When a service's timer loop runs: at its next deadline or when an input brings one
nearer, not on a fixed period (issue 34, "no work while idle").

The loop's owner computes, after each tick, the earliest time anything is due (``due``);
between two ticks nothing is due before it except what an input brings nearer, and each
such input pokes :class:`TickWake`. :func:`next_tick` keeps ticks at least ``gap`` apart
under load (events within that gap share one tick) and at most ``longest`` apart when idle
(a safety net should an input forget to poke).

* The assigner (:meth:`GroupRegistry.tick <services.assigner.registry.GroupRegistry.tick>`):
  member, lease, hold and binding deadlines, pending rebalances; a join, a leave, a release,
  a move, a pause, a grant sent or withheld, a shorter TTL or a new group pokes (the
  coordinator's ``on_sooner``); a plain heartbeat only moves deadlines later. Its idle
  ticks, once a second, are also the pace of the loop-lag samples the join admission reads.
  It ticked ten times a second before, about a third of an idle assigner's CPU.
* The notifier (:meth:`FaultPipeline.tick <services.notifier.pipeline.FaultPipeline.tick>`):
  storm-suppression summaries, held alerts, the outbox gauge; a suppressed report or a
  published fault pokes. It ticked twice a second before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

IDLE_TICK_SECONDS = 1.0


def next_tick(ticked: float, due: float, gap: float, longest: float = IDLE_TICK_SECONDS) -> float:
    """When the tick after the one at ``ticked`` runs unless poked: at the earliest
    deadline ``due``, but no sooner than ``gap`` after ``ticked`` and no later than
    ``longest`` after it (pure)."""
    return min(max(due, ticked + gap), ticked + max(longest, gap))


class TickWake:
    """A timer loop's sleep and its wake-up. Used on the event loop's thread only."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._poked = asyncio.Event()
        self._poked_at = 0.0

    def poke(self) -> None:
        """An input may have brought a deadline nearer: tick soon (at most once per gap)."""
        if not self._poked.is_set():
            self._poked_at = self.clock()
            self._poked.set()

    async def sleep(self, ticked: float, until: float, gap: float) -> float:
        """Sleep until ``until`` or a poke, then no sooner than ``ticked + gap``; returns
        how much later than it meant to the loop woke (the event loop's lag: a busy loop
        runs its timers and callbacks late). Pokes before the call (during the tick, which
        computed ``until`` after them) are not waited for."""
        self._poked.clear()
        start = self.clock()
        meant = max(until, start)
        if until > start:
            try:
                await asyncio.wait_for(self._poked.wait(), until - start)
            except TimeoutError:
                return max(0.0, self.clock() - meant)
            meant = max(self._poked_at, start)
            earliest = ticked + gap
            if self.clock() < earliest:
                await asyncio.sleep(earliest - self.clock())
                meant = earliest
        else:
            await asyncio.sleep(0)  # let the loop run what is ready, then measure
        return max(0.0, self.clock() - meant)
