"""A DsClient against in-process sidecars: real StreamService servicers on grpc.aio servers
(port 0) over real partition tables and lease keepers (``tests/unit/sidecar/stream_harness``),
and an assigner that only binds (every client to every sidecar), all on one event loop in a
background thread, so the client's blocking calls run on the test's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc.aio

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from services.consumer_sidecar.rpc import StreamServicer, add_to_server
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.settings import ServiceSettings
from tests.unit.sidecar.stream_harness import FakeReaders, Sidecar

T = TypeVar("T")


class OnlyBinding(binding_pb2_grpc.BindingServiceServicer):
    """Binds every client to every sidecar, once; the watch never changes it."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    def binding(self, request: Any) -> types_pb2.Binding:
        return types_pb2.Binding(
            client_id=request.client_id,
            group=request.group,
            version=1,
            endpoints=[
                types_pb2.SidecarEndpoint(sidecar_id=f"sc-{i}", address=a)
                for i, a in enumerate(self.addresses)
            ],
        )

    async def Bind(self, request: Any, context: Any) -> binding_pb2.BindResponse:
        return binding_pb2.BindResponse(binding=self.binding(request))

    async def WatchBinding(
        self, request: Any, context: Any
    ) -> AsyncIterator[binding_pb2.WatchBindingResponse]:
        if request.known_version < 1:
            yield binding_pb2.WatchBindingResponse(binding=self.binding(request))
        await asyncio.Event().wait()  # until the client goes

    async def Unbind(self, request: Any, context: Any) -> binding_pb2.UnbindResponse:
        return binding_pb2.UnbindResponse()


class InProcessMesh:
    """``sidecars`` (stream_harness.Sidecar) served at ``addresses``; ``assigner`` binds."""

    def __init__(self, count: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.sidecars: list[Sidecar] = []
        self.addresses: list[str] = []
        self._servers: list[grpc.aio.Server] = []
        self.call(self._start(count))

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the mesh's loop and wait for its result."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(30)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the mesh's loop (table and keeper calls) and return its result."""

        async def wrapped() -> T:
            return fn()

        return self.call(wrapped())  # type: ignore[no-any-return]

    async def _start(self, count: int) -> None:
        for _ in range(count):
            sidecar = Sidecar()
            sidecar.data.bind_loop(asyncio.get_running_loop())
            servicer = StreamServicer(sidecar.serving, FakeReaders())  # type: ignore[arg-type]
            server = create_server(
                ServiceSettings(grpc_port=0, http_port=0),
                [GrpcService("dataservice.sidecar.v1.StreamService", servicer, add_to_server)],
            )
            await server.server.start()
            self._servers.append(server.server)
            self.sidecars.append(sidecar)
            self.addresses.append(f"127.0.0.1:{server.port}")
        assigner = grpc.aio.server()
        binding_pb2_grpc.add_BindingServiceServicer_to_server(OnlyBinding(self.addresses), assigner)
        port = assigner.add_insecure_port("127.0.0.1:0")
        await assigner.start()
        self._servers.append(assigner)
        self.assigner = f"127.0.0.1:{port}"

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                await server.stop(0)

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextmanager
def in_process_mesh(count: int) -> Iterator[InProcessMesh]:
    mesh = InProcessMesh(count)
    try:
        yield mesh
    finally:
        mesh.close()
