"""A Session stream that goes silent without ending is given up: the sidecar re-joins.

Seen in tests/e2e/test_mode_switch.py: the assigner ended a sidecar's stream (a mode
switch's rejoin_all) just as the sidecar wrote a heartbeat, and the sidecar's side of the
call never ended — no message, no status — so it never re-joined and the assigner lost
it at TTL + grace. A half-open connection looks the same. Heartbeat acks come every
interval, so a stream silent for a TTL plus an interval is cancelled and the session
re-joins. An in-process grpc.aio assigner accepts each join and then says nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.session import SessionClient, SessionIdentity

TTL = 0.6
INTERVAL = 0.2


def seconds(value: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(value * 1e9))
    return duration


class SilentAssigner(assigner_pb2_grpc.AssignerServiceServicer):
    """Accepts the join, then neither answers nor ends the stream."""

    def __init__(self) -> None:
        self.joins: list[float] = []

    async def Session(
        self, request_iterator: AsyncIterator[assigner_pb2.SessionRequest], context: Any
    ) -> AsyncIterator[assigner_pb2.SessionResponse]:
        await anext(request_iterator)
        self.joins.append(time.monotonic())
        yield assigner_pb2.SessionResponse(
            accepted=assigner_pb2.SessionAccepted(
                session_id=f"s{len(self.joins)}",
                lease_ttl=seconds(TTL),
                heartbeat_interval=seconds(INTERVAL),
            )
        )
        await asyncio.sleep(3600)


def test_a_silent_session_is_given_up_and_the_sidecar_rejoins() -> None:
    async def main() -> list[float]:
        server = grpc.aio.server()
        assigner = SilentAssigner()
        assigner_pb2_grpc.add_AssignerServiceServicer_to_server(assigner, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        loop = asyncio.get_running_loop()
        keeper = LeaseKeeper(
            PartitionTable(1 << 20, loop.time),
            object(),  # type: ignore[arg-type]  # no grant ever comes
            object(),  # type: ignore[arg-type]  # nor a commit
            commit_interval=1,
            commit_max_acks=10,
        )
        client = SessionClient(
            SessionIdentity("sc-1", "g", "127.0.0.1:1"), f"127.0.0.1:{port}", keeper,
            safety_margin=0.1,
        )  # fmt: skip
        task = asyncio.create_task(client.run())
        try:
            deadline = time.monotonic() + 10
            while len(assigner.joins) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await server.stop(0)
        return assigner.joins

    joins = asyncio.run(main())
    assert len(joins) >= 3, f"re-joined {len(joins) - 1} times in 10 s"
    gaps = [b - a for a, b in itertools.pairwise(joins)]
    # Given up after TTL + interval of silence (checked once per interval), not sooner.
    assert all(gap > TTL + INTERVAL for gap in gaps), gaps
