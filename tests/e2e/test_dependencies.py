"""An unreachable Kafka or Consul is not a configuration error.

The service starts, reports NOT_SERVING (gRPC health and /healthz) with a clear log line,
retries with backoff, and becomes SERVING once the dependency appears.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.devstack.consul import ConsulAgent, ConsulOptions
from services.devstack.kafka import KafkaCluster, KafkaOptions
from services.devstack.ports import free_port
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def assert_not_serving_with_reason(svc: ServiceProcess, dependency: str) -> None:
    wait_for(lambda: svc.healthz() == 503, 30, f"{svc.kind} /healthz to answer 503")
    assert svc.grpc_health() == "NOT_SERVING"
    assert svc.proc is not None and svc.proc.poll() is None, "the service must keep running"
    wait_for(
        lambda: (
            "dependency unreachable" in svc.tail(200)
            and f"dependency={dependency}" in svc.tail(200)
        ),
        30,
        f"{svc.kind} to log that {dependency} is unreachable",
    )
    assert "Traceback" not in svc.tail(400)


def test_services_wait_for_kafka_then_serve(tmp_path: Path) -> None:
    port = free_port()
    mesh = Mesh(f"127.0.0.1:{port}", tmp_path)
    kafka = KafkaCluster(KafkaOptions(base_dir=tmp_path / "kafka", port=port))
    try:
        assigner = mesh.assigner()
        sidecar = mesh.sidecar("late-group", assigner, "sidecar-late")
        notifier = mesh.service("notifier")
        for svc in (assigner, sidecar, notifier):
            assert_not_serving_with_reason(svc, "kafka")
        time.sleep(3)  # a few retries with backoff; still up, still NOT_SERVING
        for svc in (assigner, sidecar, notifier):
            assert svc.healthz() == 503 and svc.proc is not None and svc.proc.poll() is None

        kafka.start()
        for svc in (assigner, sidecar, notifier):
            svc.wait_serving(timeout=60)
            assert svc.grpc_health() == "SERVING"
            assert "dependencies reachable again" in svc.log.read_text(errors="replace")
    finally:
        mesh.stop_all()
        kafka.stop()


def test_service_waits_for_consul_then_registers(kafka_cluster: object, tmp_path: Path) -> None:
    consul_port = free_port()
    consul_addr = f"127.0.0.1:{consul_port}"
    mesh = Mesh(kafka_cluster.bootstrap, tmp_path, consul=consul_addr)  # type: ignore[attr-defined]
    agent = ConsulAgent(ConsulOptions(base_dir=tmp_path / "consul", http_port=consul_port))
    try:
        assigner = mesh.assigner()
        assert_not_serving_with_reason(assigner, "consul")
        agent.start()
        assigner.wait_serving(timeout=60)
        import consul

        client = consul.Consul(host="127.0.0.1", port=consul_port)
        wait_for(
            lambda: any(s["Service"] == "ds-assigner" for s in client.agent.services().values()),
            30,
            "ds-assigner to be registered",
        )
    finally:
        mesh.stop_all()
        agent.stop()
