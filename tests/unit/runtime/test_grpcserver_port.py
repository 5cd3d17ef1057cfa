"""A service's gRPC port is its own: a second server on a port already bound fails to
start with a clear error instead of sharing it.

gRPC sets SO_REUSEPORT on Linux by default, so two processes could bind the same port and
the kernel spread connections between them. CI's run of 27 Nov (11:30 UTC) had two
sidecars of tests/e2e/test_drain.py on 127.0.0.1:39603: a client's fetches and acks went
to either, and the test failed."""

from __future__ import annotations

import asyncio

import pytest

from services.runtime.grpcserver import create_server
from services.runtime.settings import ServiceSettings


def test_a_second_server_on_a_bound_port_fails_to_start() -> None:
    async def main() -> None:
        first = create_server(ServiceSettings(host="127.0.0.1", grpc_port=0, http_port=0), [])
        await first.server.start()
        try:
            taken = ServiceSettings(host="127.0.0.1", grpc_port=first.port, http_port=0)
            with pytest.raises(OSError, match=f"cannot bind gRPC port 127.0.0.1:{first.port}"):
                create_server(taken, [])
        finally:
            await first.server.stop(None)

    asyncio.run(main())
