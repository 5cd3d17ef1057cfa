"""Service discovery: Consul when configured, a static table otherwise (ARCHITECTURE §2).

Services register with a gRPC health check so Consul itself asks ``grpc.health.v1.Health``;
over TLS when the port serves TLS (``ServiceInstance.tls``): Consul then dials with TLS, does
not verify the server's certificate (a health probe, like the kubelet's HTTPS probes; the
answer only says SERVING or not), and, when the port requires a client certificate (mTLS),
presents its agent's own (``enable_agent_tls_for_checks`` and the agent's ``tls.defaults``:
deploy/docker-compose.yml's Consul, ``dsctl dev up --secure --with-consul``'s), naming the
address it dials as the server (SNI), not the Consul node. Callers find healthy instances
with *blocking queries* (they return as soon as the set changes), never with a TTL cache.
The py-consul client is synchronous, so calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from dsclient.addresses import parse_host_port
from dsclient.long_poll import long_poll

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ServiceInstance:
    name: str
    id: str
    address: str
    port: int
    tags: tuple[str, ...] = ()
    meta: Mapping[str, str] = field(default_factory=dict)
    tls: bool = False  # the gRPC port serves TLS: Consul's health check must dial with TLS

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"


class Discovery(Protocol):
    name: str

    async def check(self) -> None:
        """Raise ConnectionError if the discovery backend cannot be reached."""

    async def register(self, instance: ServiceInstance) -> None: ...

    async def deregister(self, instance: ServiceInstance) -> None: ...

    async def healthy(
        self, service: str, *, index: int | None = None, wait_seconds: float = 30.0
    ) -> tuple[int, list[ServiceInstance]]:
        """Healthy instances; with ``index`` block until the set changes or the wait ends."""
        ...


class StaticDiscovery:
    """The embedded default: a fixed table of service name → endpoints, no health."""

    name = "static"

    def __init__(self, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self._table: dict[str, list[ServiceInstance]] = {}
        for service, endpoints in (table or {}).items():
            for endpoint in endpoints:
                host, port = parse_host_port(endpoint)
                self._table.setdefault(service, []).append(
                    ServiceInstance(service, f"{service}-{endpoint}", host, port)
                )

    async def check(self) -> None:
        return None

    async def register(self, instance: ServiceInstance) -> None:
        self._table.setdefault(instance.name, []).append(instance)

    async def deregister(self, instance: ServiceInstance) -> None:
        self._table[instance.name] = [
            i for i in self._table.get(instance.name, []) if i.id != instance.id
        ]

    async def healthy(
        self, service: str, *, index: int | None = None, wait_seconds: float = 30.0
    ) -> tuple[int, list[ServiceInstance]]:
        if index is not None:
            # Nothing ever changes in a static table: behave like a blocking query that
            # times out, so watch loops do not spin.
            await asyncio.sleep(wait_seconds)
        return 1, list(self._table.get(service, []))


class ConsulDiscovery:
    """Registration with a gRPC health check and blocking health queries on Consul."""

    name = "consul"

    def __init__(self, address: str, *, check_interval: str = "1s") -> None:
        import consul  # only with --consul: static discovery never loads it (issue 34)

        host, port = parse_host_port(address, what="consul address")
        self._address = address
        self._client = consul.Consul(host=host, port=port, connections_timeout=5)
        # A separate client (own HTTP session) for blocking queries, which hold a request
        # open for up to their wait; py-consul adds the wait to the timeout by itself.
        self._watch_client = consul.Consul(host=host, port=port, connections_timeout=5)
        self._check_interval = check_interval

    async def check(self) -> None:
        try:
            await asyncio.to_thread(self._client.agent.self)
        except Exception as exc:
            raise ConnectionError(f"Consul at {self._address} unreachable: {exc}") from exc

    async def register(self, instance: ServiceInstance) -> None:
        check = grpc_check(instance, self._check_interval)
        await asyncio.to_thread(
            self._client.agent.service.register,
            instance.name,
            service_id=instance.id,
            address=instance.address,
            port=instance.port,
            tags=list(instance.tags),
            meta=dict(instance.meta),
            check=check,
        )
        log.info("registered with consul", service_id=instance.id, endpoint=instance.endpoint)

    async def deregister(self, instance: ServiceInstance) -> None:
        await asyncio.to_thread(self._client.agent.service.deregister, instance.id)
        log.info("deregistered from consul", service_id=instance.id)

    async def healthy(
        self, service: str, *, index: int | None = None, wait_seconds: float = 30.0
    ) -> tuple[int, list[ServiceInstance]]:
        kwargs: dict[str, Any] = {"passing": True}
        if index is not None:
            kwargs.update(index=index, wait=f"{int(wait_seconds)}s")
        new_index, nodes = await long_poll(self._watch_client.health.service, service, **kwargs)
        return int(new_index), [_instance(service, node) for node in nodes]


def grpc_check(instance: ServiceInstance, interval: str) -> dict[str, Any]:
    """Consul's gRPC health check of ``instance``: with TLS when its port serves TLS (a
    plaintext check of a TLS port always fails, so a replica could never hold the leader
    lock, whose session is bound to this check)."""
    import consul

    tls = {"use_tls": True, "tls_skip_verify": True} if instance.tls else {}
    check: dict[str, Any] = consul.Check.grpc(
        instance.endpoint, interval=interval, timeout="2s", deregister="1m", **tls
    )
    if instance.tls:
        # The name the check's handshake asks for (SNI): the address it dials, which the
        # service's certificate names (an IP address sends none). Left empty, an agent with
        # TLS for checks sends its node name, and gRPC servers log "No match found for
        # server name" at every check.
        check["TLSServerName"] = instance.address
    return check


def _instance(service: str, node: Mapping[str, Any]) -> ServiceInstance:
    svc = node["Service"]
    address = svc.get("Address") or node["Node"]["Address"]
    return ServiceInstance(
        name=service,
        id=svc["ID"],
        address=address,
        port=int(svc["Port"]),
        tags=tuple(svc.get("Tags") or ()),
        meta=dict(svc.get("Meta") or {}),
    )


def make_discovery(consul_address: str | None) -> Discovery:
    return ConsulDiscovery(consul_address) if consul_address else StaticDiscovery()
