"""Redelivery of the sidecar's leased records (ARCHITECTURE §3 "Delivery").

Records in flight past the visibility timeout, nacked, held by a stream that ended, or
taken by a response that was never sent come due (:mod:`partitions`, :mod:`acks`): the
:class:`Redeliverer` counts them, reports those given up past the delivery limit
(POISON_RECORD) or parked for the dead-letter topic, and has the fetch thread re-read the
partitions whose due records lie below their cursor. Its loop sleeps until the earliest
visibility deadline of a record in flight (:func:`idle_waits.redelivery_wait`), and with
none in flight until a delivery. Nacks are checked by the lease keeper (:mod:`leasing`),
which hands what they gave back to :meth:`Redeliverer.after_due`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from services.consumer_sidecar.acks import Holder
from services.consumer_sidecar.events import RedeliveryEvents
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.idle_waits import redelivery_wait
from services.consumer_sidecar.partitions import Due, PartitionTable
from services.consumer_sidecar.wakeup import Wakeup

log = structlog.get_logger(__name__)


class Redeliverer:
    def __init__(
        self,
        table: PartitionTable,
        fetcher: Fetcher,
        *,
        uncommitted: Callable[[], None],
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        clock: Callable[[], float] = time.monotonic,
        events: RedeliveryEvents | None = None,
    ) -> None:
        self.table = table
        self.fetcher = fetcher
        self.clock = clock
        self._events = events or RedeliveryEvents()
        # Given-up records count as acked: the next commit round must carry them.
        self._uncommitted = uncommitted
        # The lease keeper's background tasks (the fetch thread's rewinds).
        self._spawn = spawn
        # Issue 34: with no record in flight the loop sleeps until a delivery
        # (``table.on_in_flight``) gives it a deadline.
        self._in_flight = Wakeup()
        table.on_in_flight = self._in_flight.set

    async def redelivery_loop(self) -> None:
        """Records whose ack deadline (the visibility timeout) passed come due: the loop
        sleeps until the earliest deadline of a record in flight (looking again at least
        every ``REDELIVERY_CHECK_SECONDS``), and with none in flight until a delivery."""
        self._in_flight.bind(asyncio.get_running_loop())
        while True:
            self._in_flight.clear()
            wait = redelivery_wait(self.table.next_deadline(), self.clock())
            if wait is None:
                await self._in_flight.wait(None)
            else:  # deliveries meanwhile set later deadlines: no need to wake for them
                await asyncio.sleep(wait)
            try:
                self.expire_deliveries()
            except Exception:  # a bug here must not stop every later redelivery
                log.exception("redelivery check failed")

    def expire_deliveries(self) -> None:
        self.after_due("visibility_timeout", self.table.expire(self.clock()))

    def release_holder(self, holder: Holder) -> None:
        """A stream ended: what it received and did not ack is delivered again now."""
        self.after_due("stream_end", self.table.release(holder))

    def not_sent(self, slices: list[Any]) -> None:
        """A response that took these slices was never sent: deliver them again now."""
        self.after_due("not_sent", self.table.redeliver_slices(slices))

    def after_due(self, why: str, due: Due) -> None:
        """Records came due: count them, report what was given up, and have the fetch
        thread re-read the partitions whose due records lie below their cursor."""
        if due.records:
            log.debug("records due again", why=why, records=due.records, rewind=len(due.rewind))
            self._events.on_redelivery(why, due.records)
        if due.given_up:
            self._uncommitted()  # the commit point passes what was given up
        for part, given_up in due.given_up:
            log.warning(
                "record given up: delivered the maximum number of times without an ack",
                topic=part.tp.topic,
                partition=part.tp.partition,
                from_offset=given_up.lo,
                to_offset=given_up.hi,
                deliveries=given_up.deliveries,
            )
            self._events.on_given_up(part.tp, part.epoch, given_up)
            if given_up.parked:
                self._events.on_dead_letter(part.tp, part.epoch, given_up, why)
        for part in due.rewind:
            self._spawn(self.fetcher.run(self.fetcher.rewind, part.tp))
