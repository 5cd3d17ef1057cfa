"""When a granted lease goes live on the sidecar (ARCHITECTURE §3.1.6).

A grant is held (and fetched) at once, but delivered and committed only from the first
heartbeat sent after it that the assigner acknowledges with a renewal; the deadline is that
heartbeat's send time + TTL - margin. An ack that names the grant without renewing it
(the assigner let it lapse or granted it elsewhere while it was in flight) drops it.

The real :class:`SessionClient` and :class:`LeaseKeeper` over a real table; only the fetch
thread's Kafka side is replaced (:class:`AssigningFetcher` marks partitions ready as
``Fetcher.assign`` does).
"""

from __future__ import annotations

import asyncio
import time

from dataservice.assigner.v1 import assigner_pb2
from services.runtime.topic_partition import TP
from tests.support.session_grants import (
    MARGIN,
    TOPIC,
    TTL,
    Harness,
    ack,
    grant,
    run,
)


def test_a_grant_is_live_only_from_the_first_renewing_ack() -> None:
    async def body(h: Harness) -> None:
        await h.session._handle(grant(0, 4))
        await asyncio.sleep(0.05)  # the burst's assign() runs
        part = h.table.get(TP(TOPIC, 0))
        assert part is not None and part.ready, "held and fetched at once"
        assert not h.live(0), "not live before the assigner acknowledged it"
        assert h.session._heartbeat_now.is_set(), "a heartbeat naming it goes out now"
        seq, sent = await h.send_heartbeat()
        await h.session._handle(ack(seq, (0, 4)))
        assert h.live(0)
        assert abs(part.deadline - (sent + TTL - MARGIN)) < 0.05

    run(body)


def test_an_ack_naming_the_grant_without_renewing_it_drops_it() -> None:
    async def body(h: Harness) -> None:
        await h.session._handle(grant(0, 4))
        await h.session._handle(grant(1, 4))
        await asyncio.sleep(0.05)
        seq, _ = await h.send_heartbeat()
        # The assigner let partition 0's grant lapse while it was in flight (and may have
        # granted it elsewhere): its ack renews only partition 1.
        await h.session._handle(ack(seq, (1, 4)))
        assert h.table.get(TP(TOPIC, 0)) is None, "the unconfirmed grant is dropped"
        assert h.live(1)
        await asyncio.sleep(0.01)
        assert TP(TOPIC, 0) in h.fetcher.unassigned

    run(body)


def test_an_ack_of_a_heartbeat_sent_before_the_grant_leaves_it_pending() -> None:
    async def body(h: Harness) -> None:
        seq, _ = await h.send_heartbeat()  # sent before the grant arrived
        await h.session._handle(grant(0, 4))
        await asyncio.sleep(0.05)
        await h.session._handle(ack(seq))
        part = h.table.get(TP(TOPIC, 0))
        assert part is not None and not part.live(time.monotonic())
        assert part.suspended_at is None
        await h.keeper.suspend_expired()
        assert part.suspended_at is None, "a fresh grant has no deadline to pass"

    run(body)


def accepted(*topics: str) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        accepted=assigner_pb2.SessionAccepted(session_id="s", topics=list(topics))
    )


def test_a_fresh_sidecar_warms_its_consumer_up_before_its_first_grants() -> None:
    """A sidecar that joins holding nothing (a restart, a scale-out) has the fetch thread
    find the group's coordinator for its topics at once, before the grants it waits for
    (a handoff's revoke, drain and release come first): their assign, queued behind it on
    the same thread, finds the lookup made."""

    async def body(h: Harness) -> None:
        await h.session._handle(accepted(TOPIC, "u"))
        await h.session._handle(grant(0, 4))
        await asyncio.sleep(0.05)
        assert h.fetcher.warmed == [[TOPIC, "u"]]
        assert h.fetcher.calls == ["warm_up", "assign"]

    run(body)


def test_a_sidecar_that_rejoins_holding_leases_does_not_warm_up() -> None:
    """Re-attaching (an assigner failover) with leases held: its consumer is fetching."""

    async def body(h: Harness) -> None:
        await h.session._handle(grant(0, 4))
        await asyncio.sleep(0.05)
        await h.session._handle(accepted(TOPIC))
        await asyncio.sleep(0.05)
        assert h.fetcher.warmed == []

    run(body)
