"""Shared fixtures: real Kafka and Consul for integration and e2e tests.

Each fixture reuses what the environment points at (``KAFKA_BOOTSTRAP``,
``CONSUL_HTTP_ADDR``) and otherwise starts a local one for the session from
``services.devstack``. Service-specific fixtures live with their tests.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from services.devstack.consul import ConsulAgent, ConsulHandle, ConsulOptions, ExternalConsul
from services.devstack.kafka import (
    ExternalKafka,
    KafkaCluster,
    KafkaHandle,
    KafkaOptions,
    TopicFactory,
)
from tests.support import accounting
from tests.support.mesh import Mesh, running_mesh

# Property tests run on shared 2-core machines beside Kafka and the e2e suites: an example
# taking longer than Hypothesis's 200 ms default, or slow data generation, is load, not a
# failure (seen 2 Dec: "Input generation is slow" in tests/unit/dsctl/test_config_view.py at
# load average 10). Tests that set their own settings keep them.
settings.register_profile(
    "shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-machine")


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaHandle]:
    """A Kafka cluster for the whole session: ``$KAFKA_BOOTSTRAP`` or a local 1-broker one."""
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP"):
        yield ExternalKafka(bootstrap)
        return
    # Data under pytest's tmp dir: the last few runs' broker logs stay around to read.
    cluster = KafkaCluster(KafkaOptions(brokers=1, base_dir=tmp_path_factory.mktemp("kafka")))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A local 3-broker cluster, started on first use; never an external one, since
    tests using it kill, pause and restart brokers."""
    cluster = KafkaCluster(KafkaOptions(brokers=3, base_dir=tmp_path_factory.mktemp("kafka3")))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def consul_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsulHandle]:
    """A Consul agent for the session: ``$CONSUL_HTTP_ADDR`` or a local dev-mode one."""
    if addr := os.environ.get("CONSUL_HTTP_ADDR"):
        # CONSUL_HTTP_ADDR may carry a scheme; the fixture hands out host:port.
        yield ExternalConsul(addr.removeprefix("http://"))
        return
    agent = ConsulAgent(ConsulOptions(base_dir=tmp_path_factory.mktemp("consul")))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@pytest.fixture
def topic_factory(
    kafka_cluster: KafkaHandle, request: pytest.FixtureRequest
) -> Iterator[TopicFactory]:
    """``topic_factory(partitions=12, replication=1, config=None) -> name``: a fresh topic
    on ``kafka_cluster`` named after the test; all are deleted after the test."""
    factory = TopicFactory(kafka_cluster.bootstrap, request.node.name)
    yield factory
    if leftovers := factory.delete_all():
        # A failed cleanup must not hide the test's own result; the topics are unique.
        warnings.warn(f"could not delete topics {leftovers}", stacklevel=1)


@pytest.fixture
def mesh(kafka_cluster: KafkaHandle, tmp_path: Path) -> Iterator[Mesh]:
    """A Mesh on the session's Kafka; every service it started is stopped after the test."""
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as m:
        yield m


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The failure tests' record accounting (tests/support/accounting.py), one line each."""
    if accounting.LINES:
        terminalreporter.section("record accounting")
        for line in accounting.LINES:
            terminalreporter.write_line(line)
