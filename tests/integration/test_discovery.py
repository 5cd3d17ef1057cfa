"""Discovery backends on a real Consul agent: registration and blocking health queries."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from dsclient.connection import TlsConfig
from services.devstack.pki import make_dev_pki
from services.runtime.discovery import ConsulDiscovery, ServiceInstance, StaticDiscovery
from services.runtime.grpcserver import create_server
from services.runtime.settings import ServiceSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_blocking_query_returns_as_soon_as_the_healthy_set_changes(consul_agent: object) -> None:
    discovery = ConsulDiscovery(consul_agent.http_addr)  # type: ignore[attr-defined]
    name = f"ds-test-{time.monotonic_ns()}"
    # Registered without a check (Consul treats that as passing), so the test needs no server.
    first = ServiceInstance(name, f"{name}-1", "127.0.0.1", 17001)
    second = ServiceInstance(name, f"{name}-2", "127.0.0.1", 17002)

    async def scenario() -> tuple[float, list[ServiceInstance]]:
        await discovery.check()
        await _register_without_check(consul_agent, first)
        index, instances = await discovery.healthy(name)
        assert [i.id for i in instances] == [first.id]

        async def register_later() -> None:
            await asyncio.sleep(1.0)
            await _register_without_check(consul_agent, second)

        started = time.monotonic()
        later = asyncio.create_task(register_later())
        _, changed = await discovery.healthy(name, index=index, wait_seconds=20)
        elapsed = time.monotonic() - started
        await later
        await discovery.deregister(first)
        await discovery.deregister(second)
        return elapsed, changed

    elapsed, changed = asyncio.run(scenario())
    assert sorted(i.id for i in changed) == [first.id, second.id]
    # It returned because the set changed (after ~1 s), not because the 20 s wait ran out.
    assert elapsed < 15, elapsed


async def _register_without_check(consul_agent: object, instance: ServiceInstance) -> None:
    import consul

    host, port = consul_agent.http_addr.split(":")  # type: ignore[attr-defined]
    client = consul.Consul(host=host, port=int(port))
    await asyncio.to_thread(
        client.agent.service.register,
        instance.name,
        service_id=instance.id,
        address=instance.address,
        port=instance.port,
    )


def test_unreachable_consul_is_reported_as_connection_error() -> None:
    discovery = ConsulDiscovery("127.0.0.1:1")
    with pytest.raises(ConnectionError, match=r"Consul at 127\.0\.0\.1:1 unreachable"):
        asyncio.run(discovery.check())


def test_static_discovery_serves_its_table() -> None:
    static = StaticDiscovery({"ds-assigner": ["10.0.0.1:7070", "10.0.0.2:7070"]})
    _, instances = asyncio.run(static.healthy("ds-assigner"))
    assert [i.endpoint for i in instances] == ["10.0.0.1:7070", "10.0.0.2:7070"]


def test_a_tls_port_is_health_checked_over_tls(
    consul_agent: object, tmp_path: pathlib.Path
) -> None:
    """A service serving TLS (the prod overlay's default, the compose stack's) registers a
    check Consul can pass: over TLS, so the instance turns healthy. A plaintext check of a
    TLS port stays critical, and an assigner replica could never take the leader lock,
    whose session is bound to that check."""
    pki = make_dev_pki(tmp_path / "pki", {}, certificates=["server"])
    tls = TlsConfig(ca_file=pki.ca, cert_file=pki.cert("server"), key_file=pki.key("server"))
    settings = ServiceSettings(tls=tls)
    discovery = ConsulDiscovery(consul_agent.http_addr)  # type: ignore[attr-defined]
    name = f"ds-test-tls-{time.monotonic_ns()}"

    async def scenario() -> list[ServiceInstance]:
        server = create_server(settings, [])
        await server.server.start()
        await server.set_serving(True)
        instance = ServiceInstance(
            name, f"{name}-1", "127.0.0.1", server.port, tls=settings.tls.server_enabled
        )
        await discovery.register(instance)
        try:
            deadline = time.monotonic() + 30
            healthy: list[ServiceInstance] = []
            while not healthy and time.monotonic() < deadline:
                _, healthy = await discovery.healthy(name)
                await asyncio.sleep(0.5)
            return healthy
        finally:
            await discovery.deregister(instance)
            await server.server.stop(None)

    healthy = asyncio.run(scenario())
    assert [i.id for i in healthy] == [f"{name}-1"]
