"""How every service starts, waits for its dependencies, and stops gracefully.

Start: bind gRPC + HTTP (health NOT_SERVING) → check dependencies (Kafka, Consul, …) with
backoff, logging clearly what is missing → register in discovery → ``on_ready`` →
SERVING. An unreachable dependency is not a configuration error: the process stays up
and keeps retrying. Stop (SIGTERM/SIGINT), in the order CONVENTIONS gives: health
NOT_SERVING → deregister → ``drain`` (the service hands work off) → ``server.stop(grace)``
→ ``close`` (Kafka clients, producers flushed).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc.aio
import structlog
from prometheus_client import CollectorRegistry

from dsclient import local_socket
from services.runtime.auth import build_guard
from services.runtime.discovery import Discovery, ServiceInstance
from services.runtime.grpcserver import GrpcServer, GrpcService, create_server
from services.runtime.http import HttpEndpoint, Route
from services.runtime.settings import ServiceSettings

log = structlog.get_logger(__name__)

# How often a ready service re-checks its dependencies.
RECHECK_SECONDS = 5.0


class Dependency(Protocol):
    name: str

    async def check(self) -> None:
        """Return if reachable; raise (ConnectionError ideally) with a clear message if not."""


class Service(Protocol):
    """What a ds-* service provides to the lifecycle runner."""

    name: str  # discovery name, e.g. "ds-assigner"
    registry: CollectorRegistry

    def grpc_services(self) -> Sequence[GrpcService]: ...

    def dependencies(self) -> Sequence[Dependency]: ...

    def http_routes(self) -> Mapping[str, Route]: ...

    def instance_meta(self) -> Mapping[str, str]: ...

    async def on_ready(self, server: GrpcServer) -> None:
        """Called once, when every dependency was first reachable."""

    async def drain(self) -> None:
        """Hand work off before the server stops (e.g. release leases)."""

    async def close(self) -> None:
        """Release resources after the server stopped (close Kafka clients, flush)."""


@dataclass
class _State:
    ready_once: bool = False
    serving: bool = False
    registered: bool = False
    problems: dict[str, str] = field(default_factory=dict)
    since: float = field(default_factory=time.time)


class ServiceRunner:
    def __init__(self, service: Service, settings: ServiceSettings, discovery: Discovery) -> None:
        self.service = service
        self.settings = settings
        self.discovery = discovery
        self.state = _State()
        self.grpc: GrpcServer | None = None
        self.http: HttpEndpoint | None = None
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def health_snapshot(self) -> tuple[bool, Mapping[str, Any]]:
        state = self.state
        return state.serving, {
            "service": self.service.name,
            "dependencies": dict(state.problems) or "ok",
            "registered": state.registered,
        }

    @property
    def instance(self) -> ServiceInstance:
        assert self.grpc is not None and self.http is not None
        host = self.settings.advertised
        return ServiceInstance(
            name=self.service.name,
            id=f"{self.service.name}-{socket.gethostname()}-{host}-{self.grpc.port}",
            address=host,
            port=self.grpc.port,
            meta={"http_port": str(self.http.port), **self.service.instance_meta()},
            tls=self.settings.tls.server_enabled,
        )

    async def start(self) -> None:
        # A service may add interceptors (the assigner's leader guard).
        interceptors: Sequence[grpc.aio.ServerInterceptor] = getattr(  # type: ignore[type-arg]
            self.service, "grpc_interceptors", tuple
        )()
        # Authorization (when on): the policy is read now, so a bad file stops the start.
        # Without TLS (a sidecar serving its pod's socket: settings allow no other case),
        # callers are authenticated on that socket only.
        guard = build_guard(
            self.settings.auth,
            self.service.registry,
            self.service.name,
            socket_only=not self.settings.tls.server_enabled,
        )
        auth = guard.interceptor(getattr(self.service, "served_group", "")) if guard else None
        # A service may also serve on a Unix domain socket (the sidecar, for its pod).
        local_socket_path: Path | None = getattr(self.service, "local_socket_path", None)
        self.grpc = create_server(
            self.settings,
            self.service.grpc_services(),
            interceptors=interceptors,
            auth=auth,
            local_socket_path=local_socket_path,
        )
        await self.grpc.server.start()
        await self.grpc.set_serving(False)
        self.http = HttpEndpoint(
            self.settings.host,
            self.settings.http_port,
            self.service.registry,
            self.health_snapshot,
            self.service.http_routes(),
            tls=self.settings.tls if self.settings.tls.server_enabled else None,
            guard=guard,
        )
        self.http.start()
        log.info(
            "listening",
            grpc=f"{self.settings.host}:{self.grpc.port}",
            http=f"{self.settings.host}:{self.http.port}",
            discovery=self.discovery.name,
            **({"socket": str(local_socket_path)} if local_socket_path else {}),
        )

    async def run(self) -> None:
        """Start, serve until a stop signal, stop gracefully."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        watcher = asyncio.create_task(self._watch_dependencies(), name="dependencies")
        try:
            await self._stop.wait()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self.stop()

    async def _watch_dependencies(self) -> None:
        delay = 0.25
        while True:
            problems = await self._check_all()
            if problems:
                if self.state.serving or not self.state.problems:
                    for dep, why in problems.items():
                        log.warning(
                            "dependency unreachable; NOT_SERVING, retrying",
                            dependency=dep,
                            error=why,
                        )
                self.state.problems = problems
                await self._set_serving(False)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.dependency_retry_max_seconds)
                continue
            if self.state.problems:
                log.info("dependencies reachable again", recovered=sorted(self.state.problems))
            self.state.problems = {}
            delay = 0.25
            if not self.state.registered:
                await self._register()
            if not self.state.ready_once:
                assert self.grpc is not None
                try:
                    await self.service.on_ready(self.grpc)
                except Exception as exc:
                    # Starting up touched a dependency that is not quite there yet (a
                    # topic just created, Kafka mid-election): stay NOT_SERVING, retry.
                    log.warning("start-up step failed; retrying", error=repr(exc))
                    self.state.problems = {"startup": repr(exc)}
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.settings.dependency_retry_max_seconds)
                    continue
                self.state.ready_once = True
            await self._set_serving(self.state.registered)
            await asyncio.sleep(RECHECK_SECONDS if self.state.registered else delay)

    async def _check_all(self) -> dict[str, str]:
        deps: list[Dependency] = [*self.service.dependencies()]
        if self.discovery.name != "static":
            deps.append(_DiscoveryDependency(self.discovery))
        results = await asyncio.gather(*(d.check() for d in deps), return_exceptions=True)
        return {
            dep.name: str(result)
            for dep, result in zip(deps, results, strict=True)
            if isinstance(result, BaseException)
        }

    async def _register(self) -> None:
        try:
            await self.discovery.register(self.instance)
            self.state.registered = True
        except Exception as exc:
            log.warning("registration failed; retrying", error=str(exc))

    async def _set_serving(self, serving: bool) -> None:
        if serving == self.state.serving or self.grpc is None:
            return
        await self.grpc.set_serving(serving)
        self.state.serving = serving
        log.info("health", status="SERVING" if serving else "NOT_SERVING")

    async def stop(self) -> None:
        log.info("stopping")
        self.state.serving = False
        if self.grpc is not None:
            await self.grpc.health.enter_graceful_shutdown()
        if self.state.registered:
            try:
                await self.discovery.deregister(self.instance)
            except Exception as exc:
                log.warning("deregistration failed", error=str(exc))
            self.state.registered = False
        try:
            await self.service.drain()
        except Exception:
            log.exception("drain failed")
        if self.grpc is not None:
            await self.grpc.server.stop(self.settings.shutdown_grace_seconds)
            if self.grpc.local_socket is not None:
                local_socket.release(self.grpc.local_socket)
        try:
            await self.service.close()
        except Exception:
            log.exception("close failed")
        if self.http is not None:
            self.http.stop()
        log.info("stopped")


class _DiscoveryDependency:
    def __init__(self, discovery: Discovery) -> None:
        self.name = discovery.name
        self._discovery = discovery

    async def check(self) -> None:
        await self._discovery.check()


def run(service: Service, settings: ServiceSettings, discovery: Discovery) -> None:
    """Entry point helper for ``__main__`` modules."""
    asyncio.run(ServiceRunner(service, settings, discovery).run())
