"""gRPC server factory: every server gets health checking, reflection and error mapping,
TLS when the settings name a certificate, and the authorization interceptor when auth is on
(after error mapping, before any service's own interceptors: a refused caller learns
nothing, not even which assigner leads). A service may also be served on a Unix domain
socket (:mod:`dsclient.local_socket`): same services, same interceptors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]
from grpc_reflection.v1alpha import reflection

from dsclient import local_socket
from dsclient.connection.settings import MAX_MESSAGE_BYTES
from dsclient.reasons import DsError, Reason
from services.runtime.error_interceptor import ErrorInterceptor
from services.runtime.server_tls import grpc_server_credentials
from services.runtime.settings import ServiceSettings

# What servers accept; clients' channel options are dsclient.connection's.
# What servers accept; clients' channel options are dsclient.connection's.
# A request is decoded before the interceptors know its caller, so what an unknown caller
# can make a server decode is bounded here (issue 37, finding 11): 16 MiB holds the largest
# legitimate request (100,000 acks or commits of long topic names), and one connection
# holds at most MAX_CONCURRENT_STREAMS calls at once (more wait for a free stream).
MAX_RECEIVE_BYTES = 16 * 1024 * 1024
MAX_CONCURRENT_STREAMS = 1000
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    # gRPC sets SO_REUSEPORT on Linux by default: a second process could bind the same port
    # and the kernel would spread connections between the two (two sidecars answering for
    # one address). Off, a port already bound fails the start with a clear error.
    ("grpc.so_reuseport", 0),
]
# Health.Watch is public (no token, like Check): at most this many streams at once per
# server (issue 37, finding 11). Consul and the kubelet use Check; Watch is for gRPC
# clients' health-checking load balancing, a handful per caller.
MAX_HEALTH_WATCHERS = 256


class BoundedHealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """grpcio's health servicer with a Watch that is bounded (issue 37, finding 11):

    * at most ``max_watchers`` streams at once (RESOURCE_EXHAUSTED TOO_MANY_WATCHERS past
      it), so an unknown caller cannot hold a task per stream without limit;
    * a name this server does not serve is answered SERVICE_UNKNOWN and the stream ends:
      nothing is kept for it (grpcio keeps a condition per watched name; our servers
      register every name they serve when they are built, so none appears later);
    * the answer is written outside the name's lock: a watcher that does not read holds
      up neither ``set`` nor the other watchers (grpcio writes under the lock).

    Watch is an async generator, as the error interceptor's wrapper expects of every
    server-streaming method (grpcio's ``context.write`` coroutine failed there UNKNOWN)."""

    def __init__(self, max_watchers: int = MAX_HEALTH_WATCHERS) -> None:
        super().__init__()
        self._max_watchers = max_watchers
        self._watching = 0

    @property
    def watching(self) -> int:
        """The Watch streams open now."""
        return self._watching

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        name = request.service
        if name not in self._server_status:
            yield health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            )
            return
        if self._watching >= self._max_watchers:
            raise DsError(
                Reason.TOO_MANY_WATCHERS,
                f"this server has {self._max_watchers} Health.Watch streams open",
                metadata={"service": "grpc.health.v1.Health", "limit": str(self._max_watchers)},
            )
        self._watching += 1
        condition = self._server_watchers[name]
        self._watcher_count_by_service[name] += 1
        try:
            last = None
            while True:
                async with condition:
                    status = self._server_status[name]
                    while status == last:
                        await condition.wait()
                        status = self._server_status[name]
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
        finally:
            self._watching -= 1
            self._watcher_count_by_service[name] -= 1
            if self._watcher_count_by_service[name] == 0:
                del self._server_watchers[name]
                del self._watcher_count_by_service[name]


@dataclass(frozen=True)
class GrpcService:
    """One servicer to mount: its full name (for health/reflection) and how to add it."""

    full_name: str
    servicer: Any
    add_to_server: Callable[[Any, grpc.aio.Server], None]


@dataclass
class GrpcServer:
    server: grpc.aio.Server
    port: int
    health: health_aio.HealthServicer
    service_names: tuple[str, ...]
    local_socket: Path | None = None  # the Unix domain socket served beside the port

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)


def create_server(
    settings: ServiceSettings,
    services: Sequence[GrpcService],
    *,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),  # type: ignore[type-arg]
    auth: grpc.aio.ServerInterceptor | None = None,  # type: ignore[type-arg]
    local_socket_path: Path | None = None,
) -> GrpcServer:
    """Build (not start) the server; health starts NOT_SERVING until dependencies are up.
    With ``local_socket_path`` it serves there too (local credentials, mode 0660; a stale
    file replaced, a live one an OSError)."""
    chain = [ErrorInterceptor(), *([auth] if auth is not None else []), *interceptors]
    server = grpc.aio.server(interceptors=chain, options=SERVER_OPTIONS)
    for svc in services:
        svc.add_to_server(svc.servicer, server)
    health = BoundedHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = tuple(svc.full_name for svc in services)
    reflection.enable_server_reflection(
        (
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    address = f"{settings.host}:{settings.grpc_port}"
    credentials = grpc_server_credentials(settings.tls)
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpcio's "Failed to bind to address ..." (in use)
        raise OSError(f"cannot bind gRPC port {settings.host}:{settings.grpc_port}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot bind gRPC port {settings.host}:{settings.grpc_port}")
    if local_socket_path is not None:
        serve_local_socket(server, local_socket_path)
    return GrpcServer(server, port, health, names, local_socket_path)


def serve_local_socket(server: grpc.aio.Server, path: Path) -> None:
    """Add the Unix domain socket ``path`` to ``server`` (gRPC binds it here, so its mode
    is set before the server starts accepting)."""
    local_socket.claim(path)
    credentials = grpc.local_server_credentials(grpc.LocalConnectionType.UDS)
    try:
        bound = server.add_secure_port(local_socket.target(path), credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot serve on {path}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot serve on {path}")
    path.chmod(local_socket.SOCKET_MODE)
