"""A Session's outgoing pipeline (groups.Connection): grants held back until durable."""

from __future__ import annotations

import asyncio

from dataservice.assigner.v1 import assigner_pb2
from services.assigner.groups import Connection


def grant(partition: int) -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(
        grant=assigner_pb2.LeaseGrant(topic="t", partition=partition, epoch=1)
    )


def test_a_stream_closed_while_a_grant_waits_for_its_write_ends_its_pump_quietly() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        errors: list[object] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        conn = Connection("a", "s")
        durable: asyncio.Future[bool] = loop.create_future()
        conn.send(grant(0), after=durable)
        pump = conn._pump
        assert pump is not None
        await asyncio.sleep(0)  # the pump waits for the write
        conn.close()  # the stream ended (the sidecar was lost) meanwhile
        durable.set_result(True)
        await asyncio.wait_for(asyncio.shield(pump), 5)
        assert pump.exception() is None and not errors
        assert conn.queue.get_nowait() is None  # only the end of the stream, no grant

    asyncio.run(run())


def test_grants_are_sent_in_order_once_durable() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        conn = Connection("a", "s")
        first: asyncio.Future[bool] = loop.create_future()
        conn.send(grant(0), after=first)
        conn.send(grant(1))  # held back behind the first
        assert conn.queue.empty()
        first.set_result(True)
        got = [await asyncio.wait_for(conn.queue.get(), 5) for _ in range(2)]
        assert [m.grant.partition for m in got if m is not None] == [0, 1]

    asyncio.run(run())


def test_a_peer_that_never_reads_is_closed_and_its_queue_freed() -> None:
    """issue 37, finding 11: a sidecar that sends heartbeats and never reads the answers
    grew its session's queue without bound; past MAX_QUEUED the session is closed."""
    from services.assigner.groups import MAX_QUEUED

    async def run() -> None:
        conn = Connection("a", "s")
        ack = assigner_pb2.SessionResponse(heartbeat_ack=assigner_pb2.HeartbeatAck(seq=1))
        for _ in range(MAX_QUEUED * 3):
            conn.send_now(ack)
            conn.send(grant(0))
        print("queued after", MAX_QUEUED * 6, "unread messages:", conn.queue.qsize())
        assert conn.closed and conn.queue.qsize() == 1
        assert conn.queue.get_nowait() is None  # the stream ends at once

    asyncio.run(run())
