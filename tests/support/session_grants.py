"""The sidecar session's unit-test harness: grants and acks driven against a session over
scripted readers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from dataservice.assigner.v1 import assigner_pb2, types_pb2
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.events import LeaseEvents, SessionEvents
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
    def __init__(
        self, session_events: SessionEvents | None = None, lease_events: LeaseEvents | None = None
    ) -> None:
        self.table = PartitionTable(1 << 20, time.monotonic)
        self.fetcher = AssigningFetcher(self.table)
        self.keeper = LeaseKeeper(
            self.table,
            self.fetcher,  # type: ignore[arg-type]
            object(),  # type: ignore[arg-type]  # no commit is made
            commit_interval=1.0,
            commit_max_acks=100,
            events=lease_events,
        )
        self.session = SessionClient(
            SessionIdentity("sc-1", "g", "127.0.0.1:1"),
            "127.0.0.1:1",
            self.keeper,
            safety_margin=MARGIN,
            events=session_events,
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


def run(
    body: Callable[[Harness], Any],
    session_events: SessionEvents | None = None,
    lease_events: LeaseEvents | None = None,
) -> None:
    async def main() -> None:
        harness = Harness(session_events, lease_events)
        await body(harness)
        # _requests is an async generator (typed as the AsyncIterator the stream takes).
        requests = harness.requests
        assert isinstance(requests, AsyncGenerator)
        await requests.aclose()

    asyncio.run(main())
