"""Discovery and the gRPC surface of every service, on a real Consul agent and Kafka.

* each service registers in Consul with a gRPC health check that passes, and deregisters
  on SIGTERM;
* ``grpcurl list`` (server reflection) shows our services, health and reflection, and
  ``grpc.health.v1.Health/Check`` says SERVING.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import consul
import pytest

from services.devstack.consul import ConsulHandle
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.tools import grpcurl_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SERVICES = {
    "ds-assigner": {
        "dataservice.assigner.v1.AssignerService",
        "dataservice.assigner.v1.BindingService",
        "dataservice.assigner.v1.AdminService",
    },
    "ds-sidecar": {"dataservice.sidecar.v1.StreamService"},
    "ds-notifier": {"dataservice.notifier.v1.NotifierService"},
}
ALWAYS = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


@contextlib.contextmanager
def serving_mesh(
    kafka: KafkaHandle, consul: ConsulHandle, label: str, log_dir: Path
) -> Iterator[tuple[Mesh, dict[str, ServiceProcess]]]:
    """An assigner, a sidecar and a notifier registered with ``consul``, all SERVING."""
    topics = TopicFactory(kafka.bootstrap, label)
    try:
        topic = topics(partitions=3)
        with running_mesh(kafka.bootstrap, log_dir, consul=consul.http_addr) as mesh:
            assigner = mesh.assigner([("cg", [topic])])
            sidecar = mesh.sidecar("cg", assigner, f"sc-{topic}")
            notifier = mesh.service("notifier")
            services = {"ds-assigner": assigner, "ds-sidecar": sidecar, "ds-notifier": notifier}
            for svc in services.values():
                svc.wait_serving()
            yield mesh, services
    finally:
        topics.delete_all()


@pytest.fixture
def consul_mesh(
    kafka_cluster: KafkaHandle, consul_agent: ConsulHandle, tmp_path: Path
) -> Iterator[tuple[Mesh, dict[str, ServiceProcess]]]:
    """The test's own mesh, for a test that stops its services."""
    with serving_mesh(kafka_cluster, consul_agent, "consul-own", tmp_path) as started:
        yield started


@pytest.fixture(scope="module")
def shared_consul_mesh(
    kafka_cluster: KafkaHandle, consul_agent: ConsulHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Mesh, dict[str, ServiceProcess]]]:
    """One mesh for the tests that only ask the services (they stop nothing, change
    nothing): starting one per test cost each about 10 s of setup and teardown."""
    log_dir = tmp_path_factory.mktemp("consul-shared")
    with serving_mesh(kafka_cluster, consul_agent, "consul-shared", log_dir) as started:
        yield started


def consul_client(addr: str) -> consul.Consul:
    host, port = addr.rsplit(":", 1)
    return consul.Consul(host=host, port=int(port))


def checks_of(client: consul.Consul, name: str, port: int) -> list[dict[str, object]]:
    _, nodes = client.health.service(name)
    return [
        check
        for node in nodes
        if node["Service"]["Port"] == port
        for check in node["Checks"]
        if check["ServiceName"] == name
    ]


def test_every_service_registers_with_a_passing_grpc_check_and_deregisters_on_sigterm(
    consul_mesh: tuple[Mesh, dict[str, ServiceProcess]], consul_agent: object
) -> None:
    _, services = consul_mesh
    client = consul_client(consul_agent.http_addr)  # type: ignore[attr-defined]
    for name, svc in services.items():
        deadline = time.monotonic() + 30
        checks: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            checks = checks_of(client, name, svc.grpc_port)
            if checks and all(c["Status"] == "passing" for c in checks):
                break
            time.sleep(0.5)
        assert checks, f"{name} is not registered"
        assert all(c["Status"] == "passing" for c in checks), checks
        assert any(c["Type"] == "grpc" for c in checks), f"{name} has no gRPC check: {checks}"

    for name, svc in services.items():
        assert svc.stop() == 0, svc.tail()
        registered = [
            s
            for s in client.agent.services().values()
            if s["Service"] == name and s["Port"] == svc.grpc_port
        ]
        assert registered == [], f"{name} still registered after SIGTERM"


def test_grpcurl_lists_services_and_health_is_serving(
    shared_consul_mesh: tuple[Mesh, dict[str, ServiceProcess]],
) -> None:
    _, services = shared_consul_mesh
    grpcurl = str(grpcurl_binary())
    for name, svc in services.items():
        listed = subprocess.run(
            [grpcurl, "-plaintext", svc.grpc_addr, "list"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split()  # fmt: skip
        assert SERVICES[name] | ALWAYS <= set(listed), listed
        health = subprocess.run(
            [grpcurl, "-plaintext", svc.grpc_addr, "grpc.health.v1.Health/Check"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert json.loads(health) == {"status": "SERVING"}


def test_bad_request_gets_a_clear_status_with_error_info(
    shared_consul_mesh: tuple[Mesh, dict[str, ServiceProcess]],
) -> None:
    _, services = shared_consul_mesh
    grpcurl = str(grpcurl_binary())
    result = subprocess.run(
        [grpcurl, "-plaintext", "-d", '{"client_id": "x", "group": "not-served"}',
         services["ds-sidecar"].grpc_addr, "dataservice.sidecar.v1.StreamService/Fetch"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode != 0
    assert "NotFound" in result.stderr and "GROUP_NOT_SERVED" in result.stderr, result.stderr
