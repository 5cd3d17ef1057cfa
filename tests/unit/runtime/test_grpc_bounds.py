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
