"""A refused Session leaves nothing behind: the sidecar's reconnect loop against an assigner
that refuses every stream (starting up: UNAVAILABLE "not serving groups yet"), on an
in-process grpc.aio server. Each refused stream used to leave gRPC's request-reading task
waiting on the request generator forever; garbage-collected, it logged "Task was destroyed
but it is pending!" and "aclose(): asynchronous generator is already running"."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.session import SessionClient, SessionIdentity


class StartingAssigner(assigner_pb2_grpc.AssignerServiceServicer):
    """Reads the join, then refuses the stream, as an assigner that does not serve yet."""

    def __init__(self) -> None:
        self.refused = 0

    async def Session(
        self, request_iterator: AsyncIterator[assigner_pb2.SessionRequest], context: Any
    ) -> AsyncIterator[assigner_pb2.SessionResponse]:
        await anext(request_iterator)
        self.refused += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not serving groups yet")
        yield assigner_pb2.SessionResponse()  # never reached


def test_refused_sessions_leave_no_pending_task_or_running_generator() -> None:
    async def main() -> list[str]:
        problems: list[str] = []
        loop = asyncio.get_running_loop()
        # What a refused stream used to leave (the docstring's two messages); grpc.aio's own
        # poller may log "Exception in callback PollerCompletionQueue._handle_events" when
        # the loop is torn down on a loaded machine, which says nothing of the session.
        loop.set_exception_handler(
            lambda _loop, ctx: (
                problems.append(str(ctx.get("message")))
                if "PollerCompletionQueue" not in str(ctx.get("message"))
                else None
            )
        )
        server = grpc.aio.server()
        assigner = StartingAssigner()
        assigner_pb2_grpc.add_AssignerServiceServicer_to_server(assigner, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        keeper = LeaseKeeper(
            PartitionTable(1 << 20, loop.time),
            object(),  # type: ignore[arg-type]  # no grant ever comes
            object(),  # type: ignore[arg-type]  # nor a commit
            commit_interval=1,
            commit_max_acks=10,
        )
        client = SessionClient(
            SessionIdentity("sc-1", "g", "127.0.0.1:1"), f"127.0.0.1:{port}", keeper,
            safety_margin=0.5,
        )  # fmt: skip
        task = asyncio.create_task(client.run())
        try:
            while assigner.refused < 5:
                await asyncio.sleep(0.05)
            for _ in range(3):  # what each refused stream left is garbage by now
                gc.collect()
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await server.stop(0)
        gc.collect()
        await asyncio.sleep(0.05)
        return problems

    problems = asyncio.run(main())
    assert problems == [], problems
