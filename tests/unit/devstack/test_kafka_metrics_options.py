"""The JMX exporter is opt-in: without ``metrics`` a broker's command line and ports are
what they were; with it every node gets an exporter port of its own (broker 0 the fixed
one when given) and the ``-javaagent`` argument naming the repo's rules file."""

from __future__ import annotations

from pathlib import Path

from services.devstack.kafka import (
    JMX_EXPORTER_RULES,
    KafkaCluster,
    KafkaOptions,
    jmx_exporter_version,
)


def planned(options: KafkaOptions) -> tuple[KafkaCluster, list[int | None]]:
    cluster = KafkaCluster(options)
    nodes = cluster._plan_nodes()
    cluster._nodes = nodes
    return cluster, [n.metrics_port for n in nodes]


def test_default_cluster_has_no_exporter(tmp_path: Path) -> None:
    cluster, ports = planned(KafkaOptions(brokers=3, base_dir=tmp_path))
    assert ports == [None, None, None]
    cluster._agent = Path("/cache/jmx_prometheus_javaagent-1.0.1.jar")  # even if fetched
    assert all(cluster._agent_argv(n) == [] for n in cluster._nodes)
    assert cluster.metrics_addresses == []


def test_metrics_give_each_node_its_own_port_and_the_agent(tmp_path: Path) -> None:
    cluster, ports = planned(KafkaOptions(brokers=3, base_dir=tmp_path, metrics=True))
    assert all(isinstance(p, int) for p in ports)
    used = {n.client_port for n in cluster._nodes} | {n.controller_port for n in cluster._nodes}
    assert len(set(ports)) == 3 and not used & set(ports)
    agent = Path("/cache/jmx_prometheus_javaagent-1.0.1.jar")
    cluster._agent = agent
    assert cluster._agent_argv(cluster._nodes[1]) == [
        f"-javaagent:{agent}=127.0.0.1:{ports[1]}:{JMX_EXPORTER_RULES}"
    ]
    assert cluster.metrics_addresses == [f"127.0.0.1:{p}" for p in ports]


def test_fixed_metrics_port_goes_to_broker_0_only_when_metrics_are_on(tmp_path: Path) -> None:
    _, ports = planned(KafkaOptions(base_dir=tmp_path, metrics=True, metrics_port=1))
    assert ports == [1]
    _, ports = planned(KafkaOptions(base_dir=tmp_path, metrics_port=1))
    assert ports == [None]


def test_the_pom_pins_a_version_and_the_rules_file_exists() -> None:
    assert jmx_exporter_version() == "1.0.1"
    assert JMX_EXPORTER_RULES.is_file()
