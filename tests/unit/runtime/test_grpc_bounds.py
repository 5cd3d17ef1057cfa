"""What a gRPC server decodes before it knows its caller is bounded (issue 37, finding
11): a request above the server's receive limit (16 MiB, down from 64) is refused
RESOURCE_EXHAUSTED by gRPC itself, here on the public (unauthenticated) health check, and
the HTTP/2 streams one connection may hold open at once are bounded."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.runtime.grpcserver import SERVER_OPTIONS, create_server
from services.runtime.settings import ServiceSettings

MIB = 1024 * 1024


def test_a_huge_request_is_refused_before_any_servicer_and_streams_are_bounded() -> None:
    options = dict(SERVER_OPTIONS)
    assert options["grpc.max_receive_message_length"] == 16 * MIB
    assert 0 < options["grpc.max_concurrent_streams"] <= 1000

    async def main() -> None:
        server = create_server(ServiceSettings(grpc_port=0, http_port=0), [])
        await server.server.start()
        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 64 * MIB)]
            ) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                huge = health_pb2.HealthCheckRequest(service="x" * (17 * MIB))
                try:
                    await stub.Check(huge, timeout=10)
                    raise AssertionError("a 17 MiB request was decoded")
                except grpc.aio.AioRpcError as err:
                    print("17 MiB Health.Check before auth:", err.code().name)
                    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                small = health_pb2.HealthCheckRequest(service="")
                assert (await stub.Check(small, timeout=10)).status
        finally:
            await server.server.stop(0)

    asyncio.run(main())


def test_health_watch_is_bounded() -> None:
    """Health.Watch is public (no token): each stream is a task on the server and each
    name it watches a condition. At most MAX_HEALTH_WATCHERS streams at once (RESOURCE_
    EXHAUSTED TOO_MANY_WATCHERS past it), and a name the server does not serve is answered
    SERVICE_UNKNOWN and the stream ends (nothing is kept for it); the served names still
    stream their changes."""
    from dsclient.reasons import Reason, error_info
    from services.runtime.grpcserver import MAX_HEALTH_WATCHERS

    async def main() -> None:
        server = create_server(ServiceSettings(grpc_port=0, http_port=0), [])
        await server.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                # unknown names: one answer, then the stream ends
                names = [f"no.such.Service{i}" for i in range(50)]
                for name in names:
                    got = [r.status async for r in stub.Watch(
                        health_pb2.HealthCheckRequest(service=name), timeout=10
                    )]  # fmt: skip
                    assert got == [health_pb2.HealthCheckResponse.SERVICE_UNKNOWN]
                # the cap: watchers that never read past it are refused
                watches = [
                    stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
                    for _ in range(MAX_HEALTH_WATCHERS)
                ]
                for call in watches:
                    assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
                extra = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
                try:
                    await extra.read()
                    raise AssertionError("a watcher past the cap was served")
                except grpc.aio.AioRpcError as err:
                    info = error_info(err)
                    print(
                        f"{MAX_HEALTH_WATCHERS} open Health.Watch streams, one more: "
                        f"{err.code().name} {info.reason if info else None} "
                        f"{dict(info.metadata) if info else {}}; unknown names held: "
                        f"{len(server.health._server_watchers)}"
                    )
                    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert info is not None and info.reason == Reason.TOO_MANY_WATCHERS
                for call in watches:
                    call.cancel()
                # the cancelled streams end on the server (their RST_STREAM arrives): a
                # new watcher is served again
                for _ in range(100):
                    again = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
                    try:
                        status = (await again.read()).status
                        break
                    except grpc.aio.AioRpcError:
                        await asyncio.sleep(0.1)
                assert status == health_pb2.HealthCheckResponse.SERVING
                again.cancel()
        finally:
            await server.server.stop(0)

    asyncio.run(main())
