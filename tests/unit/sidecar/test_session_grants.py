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
from collections.abc import Callable
from typing import Any

from dataservice.assigner.v1 import assigner_pb2, types_pb2
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.session import SessionClient, SessionIdentity
from services.runtime.topic_partition import TP

TTL, MARGIN = 3.0, 0.5
TOPIC = "t"


class AssigningFetcher:
    """Kafka's side of the fetch thread: assign() makes partitions ready at offset 0."""

    def __init__(self, table: PartitionTable) -> None:
        self.table = table
        self.unassigned: list[TP] = []
        self.calls: list[str] = []  # warm_up and assign, in the order the thread ran them
        self.warmed: list[list[str]] = []

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def warm_up(self, topics: list[str]) -> None:
        self.calls.append("warm_up")
        self.warmed.append(topics)

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]:
        self.calls.append("assign")
        with self.table.lock:
            for tp in starts:
                part = self.table.partitions[tp]
                part.acks = PartitionAcks(0)
                part.position = part.committed = 0
                part.ready = True
        return {tp: 0 for tp in starts}

    def unassign(self, tp: TP) -> None:
        self.unassigned.append(tp)

    def suspend(self, tp: TP) -> None:
        return None

    def resume(self, tp: TP) -> None:
        return None


def grant(partition: int, epoch: int) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        grant=assigner_pb2.LeaseGrant(topic=TOPIC, partition=partition, epoch=epoch, start_offset=0)
    )


def ack(seq: int, *renewed: tuple[int, int]) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        heartbeat_ack=assigner_pb2.HeartbeatAck(
            seq=seq,
            renewed_leases=[
                types_pb2.LeaseRef(topic=TOPIC, partition=p, epoch=e) for p, e in renewed
            ],
        )
    )


class Harness:
    def __init__(self) -> None:
        self.table = PartitionTable(1 << 20, time.monotonic)
        self.fetcher = AssigningFetcher(self.table)
        self.keeper = LeaseKeeper(
            self.table,
            self.fetcher,  # type: ignore[arg-type]
            commit_interval=1.0,
            commit_max_acks=100,
        )
        self.session = SessionClient(
            SessionIdentity("sc-1", "g", "127.0.0.1:1"),
            "127.0.0.1:1",
            self.keeper,
            safety_margin=MARGIN,
        )
        self.session.ttl = TTL
        self.session.connected = True
        self.requests = self.session._requests(self.session._outbox)

    async def send_heartbeat(self) -> tuple[int, float]:
        """The heartbeat loop's next heartbeat, as it goes on the wire: (seq, send time)."""
        self.session._outbox.put_nowait(self.session._heartbeat())
        request = await anext(self.requests)
        return request.heartbeat.seq, time.monotonic()

    def live(self, partition: int) -> bool:
        part = self.table.get(TP(TOPIC, partition))
        return part is not None and part.live(time.monotonic())


def run(body: Callable[[Harness], Any]) -> None:
    async def main() -> None:
        harness = Harness()
        await body(harness)
        await harness.requests.aclose()

    asyncio.run(main())


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
