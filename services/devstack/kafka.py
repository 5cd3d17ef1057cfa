"""A real Apache Kafka 4.x cluster (KRaft, no ZooKeeper) for development and tests.

The broker runs from the jars that ``deploy/kafka/pom.xml`` names, fetched once with Maven
into ``$DS_CACHE_DIR/kafka-<version>/libs``. Every node is a combined broker+controller
process on loopback ports, formatted with ``kafka.tools.StorageTool`` and started as
``java ... kafka.Kafka server.properties`` in its own process group.

Topics are never auto-created (``auto.create.topics.enable=false``): a test that forgets
to create its topic fails loudly instead of silently getting a 1-partition topic.

With ``KafkaOptions(metrics=True)`` each broker also runs the Prometheus JMX exporter java
agent (``deploy/kafka/jmx-exporter/pom.xml``, fetched into the same cache) with the rules of
``deploy/kafka/jmx-exporter.yml`` on a port of its own: ``/metrics`` there serves the broker's
``kafka_*`` metrics. Off by default, so the test suite's brokers start as before.

CLI, for debugging: ``python -m services.devstack.kafka --brokers 1 --dir /tmp/k --port 9092``.

One job, why whole (about 700 lines): a local KRaft Kafka cluster for tests and the dev
stack (fetch, configure, start and stop one or three brokers) and its handles. The options, the
per-node processes and the cluster's lifecycle are one life cycle; the external-cluster
handle and topic factory beside them are the interface the tests use for either kind.
"""

from __future__ import annotations

import argparse
import base64
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from services.devstack import procs
from services.devstack.cache import cache_dir, ensure_maven_jars
from services.devstack.ports import LOOPBACK, free_ports, port_is_open
from services.runtime.topics import TopicSpec, ensure_topic

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kafka"
POM = DEPLOY_DIR / "pom.xml"
LOG4J2_CONFIG = DEPLOY_DIR / "log4j2.properties"
JMX_EXPORTER_POM = DEPLOY_DIR / "jmx-exporter" / "pom.xml"
JMX_EXPORTER_RULES = DEPLOY_DIR / "jmx-exporter.yml"


def kafka_version(pom: Path = POM) -> str:
    """The Kafka version the pom pins, so the cache dir name cannot drift from the pom."""
    match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", pom.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> property in {pom}")
    return match.group(1)


def jmx_exporter_version(pom: Path = JMX_EXPORTER_POM) -> str:
    """The JMX exporter version its pom pins (the cache dir is named after it)."""
    match = re.search(
        r"<jmx\.exporter\.version>\s*([^<\s]+)\s*</jmx\.exporter\.version>", pom.read_text()
    )
    if match is None:
        raise RuntimeError(f"no <jmx.exporter.version> property in {pom}")
    return match.group(1)


def ensure_jmx_exporter_agent() -> Path:
    """The Prometheus JMX exporter java agent jar, fetched from Maven Central on first use
    (like the Kafka jars: cached, re-fetched when its pom changes)."""
    libs = cache_dir() / f"jmx-exporter-{jmx_exporter_version()}"
    folder = ensure_maven_jars(
        JMX_EXPORTER_POM, libs, "jmx_prometheus_javaagent-*.jar", "the JMX exporter agent"
    )
    return next(folder.glob("jmx_prometheus_javaagent-*.jar"))


def ensure_kafka_jars() -> Path:
    """Return the directory holding the Kafka runtime jars, fetching them with Maven if needed.

    The marker file stores the pom's hash, so editing the pom (a version bump, a logging
    fix) re-fetches instead of mixing old and new jars in one classpath.
    """
    libs = cache_dir() / f"kafka-{kafka_version()}" / "libs"
    return ensure_maven_jars(POM, libs, "kafka_*.jar", "Kafka jars")


def random_kafka_uuid() -> str:
    """A Kafka ``Uuid`` string (base64url, no padding) for cluster and directory ids."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # Kafka's own generator rejects ids starting with '-': they read as CLI flags.
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class KafkaOptions:
    """How to run the local cluster. Defaults suit a test session on a small shared box."""

    brokers: int = 1
    # Node dirs go under here; None means a fresh temp dir that stop() deletes.
    base_dir: Path | None = None
    # Fixed client port for broker 0 (e.g. 9092 for `dsctl dev up`); None picks free ports.
    port: int | None = None
    heap_min: str = "256m"
    heap_max: str = "512m"
    # Serial GC and C1-only JIT: far less CPU at start-up and idle than the defaults.
    jvm_opts: tuple[str, ...] = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
    start_timeout: float = 120.0
    stop_timeout: float = 30.0
    # Extra or overriding server.properties entries, applied to every node.
    properties: Mapping[str, str] = field(default_factory=dict)
    # Run the Prometheus JMX exporter agent in every broker (``/metrics`` of ``kafka_*``).
    metrics: bool = False
    # Fixed exporter port for broker 0 (e.g. 7061 for `dsctl dev up`); None picks free ports.
    metrics_port: int | None = None
    # SIGKILL the JVMs if the Python process that started them dies (Linux). Note the
    # kernel ties this to the *thread* that spawned the node: start from a long-lived one.
    die_with_parent: bool = True
    java: str = "java"

    def __post_init__(self) -> None:
        if self.brokers not in (1, 3):
            raise ValueError(f"brokers must be 1 or 3, got {self.brokers}")


@dataclass
class _Node:
    node_id: int
    dir: Path
    client_port: int
    controller_port: int
    directory_id: str
    # The JMX exporter's HTTP port, None when the cluster runs without metrics.
    metrics_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    # Set by kill/stop_broker: a node we took down on purpose is not a failure.
    down_on_purpose: bool = False

    @property
    def properties_file(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class KafkaCluster:
    """One or three combined broker+controller KRaft nodes on 127.0.0.1."""

    def __init__(self, options: KafkaOptions | None = None) -> None:
        self.options = options or KafkaOptions()
        self._nodes: list[_Node] = []
        self._owned_dir: Path | None = None
        self._libs: Path | None = None
        self._agent: Path | None = None

    # -- public API --------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:p0,127.0.0.1:p1,..."`` for every node."""
        self._require_started()
        return ",".join(f"{LOOPBACK}:{n.client_port}" for n in self._nodes)

    @property
    def metrics_addresses(self) -> list[str]:
        """``host:port`` of each node's JMX exporter (``/metrics``); empty without metrics."""
        self._require_started()
        return [f"{LOOPBACK}:{n.metrics_port}" for n in self._nodes if n.metrics_port]

    @property
    def pids(self) -> list[int | None]:
        """The JVM pid per node, None for a node that is not running."""
        return [n.proc.pid if n.running() and n.proc else None for n in self._nodes]

    def start(self) -> KafkaCluster:
        """Write configs, format storage, start every node and wait until all serve."""
        if self._nodes:
            raise RuntimeError("cluster already started")
        self._libs = ensure_kafka_jars()
        if self.options.metrics:
            self._agent = ensure_jmx_exporter_agent()
        try:
            self._nodes = self._plan_nodes()
            cluster_id = random_kafka_uuid()
            for node in self._nodes:
                self._write_properties(node)
            self._format_storage(cluster_id)
            for node in self._nodes:
                self._spawn(node)
            self._wait_ready(self.options.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (SIGTERM, wait, SIGKILL) and delete an owned dir. Idempotent."""
        self.stop_all_brokers()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    def kill_broker(self, i: int) -> None:
        """SIGKILL node ``i`` (no controlled shutdown)."""
        node = self._node(i)
        node.down_on_purpose = True
        if node.proc is not None:
            procs.kill(node.proc)

    def stop_broker(self, i: int) -> None:
        """Gracefully stop node ``i`` (controlled shutdown)."""
        node = self._node(i)
        node.down_on_purpose = True
        if node.proc is not None:
            procs.terminate(node.proc, timeout=self.options.stop_timeout)

    def start_broker(self, i: int, wait: bool = True) -> None:
        """Restart node ``i`` with its old config and data dir; wait until it serves again."""
        node = self._node(i)
        if node.running():
            raise RuntimeError(f"broker {i} is already running")
        node.down_on_purpose = False
        self._spawn(node)
        if wait:
            self._wait_ready(self.options.start_timeout)

    def pause_broker(self, i: int) -> None:
        """SIGSTOP node ``i``: alive for the OS, silent for the cluster.

        Returns once the kernel reports the JVM stopped, so a test's clock starts then.
        """
        self._signal(i, signal.SIGSTOP)
        proc = self._node(i).proc
        if proc is not None:
            procs.wait_until(
                lambda: procs.is_stopped(proc.pid), timeout=5, what=f"SIGSTOP of broker {i}"
            )

    def resume_broker(self, i: int) -> None:
        """SIGCONT node ``i``."""
        self._signal(i, signal.SIGCONT)

    def stop_all_brokers(self) -> None:
        """Stop every node (SIGTERM, wait, SIGKILL) but keep their data: the whole cluster
        down, to be brought back by :meth:`start_all_brokers`."""
        # Signal all first so the nodes shut down in parallel; a combined node waits on
        # the quorum during shutdown, so stopping them one by one takes much longer.
        for node in self._nodes:
            node.down_on_purpose = True
            if node.running() and node.proc is not None:
                procs.signal_group(node.proc, signal.SIGTERM)
                procs.signal_group(node.proc, signal.SIGCONT)
        deadline = time.monotonic() + self.options.stop_timeout
        for node in self._nodes:
            if node.proc is not None:
                procs.terminate(node.proc, timeout=max(0.0, deadline - time.monotonic()))

    def start_all_brokers(self, timeout: float | None = None) -> None:
        """Start every stopped node, then wait until all serve (one node alone never would:
        the controllers need a quorum); ``timeout`` defaults to the options' start_timeout."""
        for node in self._nodes:
            if not node.running():
                node.down_on_purpose = False
                self._spawn(node)
        self._wait_ready(self.options.start_timeout if timeout is None else timeout)

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the node leading it now (-1 while it has none), from the metadata."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        described = admin.list_topics(topic, timeout=10).topics[topic]
        if described.error is not None:
            raise KafkaException(described.error)
        return {p: meta.leader for p, meta in described.partitions.items()}

    def fully_replicated(self, topic: str) -> bool:
        """Every partition of ``topic`` has a leader and all its replicas in sync (what a
        rolling restart waits for before it takes the next broker down)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            described = admin.list_topics(topic, timeout=5).topics[topic]
        except KafkaException:
            return False
        return described.error is None and all(
            meta.leader >= 0 and set(meta.isrs) == set(meta.replicas)
            for meta in described.partitions.values()
        )

    def active_controller(self, timeout: float = 60.0) -> int:
        """The node id of the active KRaft controller (the metadata quorum's leader), as
        ``kafka-metadata-quorum.sh describe --status`` reports it. Brokers cannot say:
        in KRaft, DescribeCluster answers a random live broker as "controller"."""
        controllers = ",".join(
            f"{LOOPBACK}:{n.controller_port}" for n in self._nodes if n.running()
        )
        argv = [
            *self._java_argv(heap_max="256m"),
            "org.apache.kafka.tools.MetadataQuorumCommand",
            "--bootstrap-controller", controllers, "describe", "--status",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        match = re.search(r"^LeaderId:\s+(\d+)", result.stdout, re.MULTILINE)
        if result.returncode != 0 or match is None:
            raise procs.StartupError(
                f"kafka-metadata-quorum failed (exit {result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return int(match.group(1))

    def log_file(self, i: int) -> Path:
        """Where node ``i`` logs (stdout and stderr of its JVM)."""
        return self._node(i).log_file

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- setup -------------------------------------------------------------------

    def _plan_nodes(self) -> list[_Node]:
        n = self.options.brokers
        base = self.options.base_dir
        if base is None:
            base = self._owned_dir = Path(tempfile.mkdtemp(prefix="ds-kafka-"))
        fixed = self.options.port
        fixed_metrics = self.options.metrics_port if self.options.metrics else None
        for port in (fixed, fixed_metrics):
            if port is not None and port_is_open(port):
                raise procs.StartupError(f"port {port} is already in use on {LOOPBACK}")
        ports = free_ports(3 * n if self.options.metrics else 2 * n)
        client_ports = ports[:n]
        if fixed is not None:
            client_ports[0] = fixed
        metrics_ports: list[int | None] = [None] * n
        if self.options.metrics:
            metrics_ports = list(ports[2 * n :])
            if fixed_metrics is not None:
                metrics_ports[0] = fixed_metrics
        return [
            _Node(
                node_id=i,
                dir=base / f"node-{i}",
                client_port=client_ports[i],
                controller_port=ports[n + i],
                directory_id=random_kafka_uuid(),
                metrics_port=metrics_ports[i],
            )
            for i in range(n)
        ]

    def _write_properties(self, node: _Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        props = {**self._base_properties(), **_node_properties(node), **self.options.properties}
        text = "".join(f"{key}={value}\n" for key, value in props.items())
        node.properties_file.write_text(text)

    def _base_properties(self) -> dict[str, str]:
        n = self.options.brokers
        replicas = str(min(3, n))
        min_isr = str(min(2, n))
        voters = ",".join(f"{LOOPBACK}:{node.controller_port}" for node in self._nodes)
        return {
            "process.roles": "broker,controller",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            # 4.x dynamic quorum: bootstrap servers instead of static controller.quorum.voters.
            "controller.quorum.bootstrap.servers": voters,
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # Tests start consumers one after another; don't make each join wait 3 s.
            "group.initial.rebalance.delay.ms": "0",
        }

    def _format_storage(self, cluster_id: str) -> None:
        # All nodes format in parallel: each is a JVM start of a few seconds.
        quorum = self._quorum_args()
        running = []
        for node in self._nodes:
            argv = [
                *self._java_argv(heap_max="256m"),
                "kafka.tools.StorageTool", "format",
                "-t", cluster_id, "-c", str(node.properties_file), *quorum,
            ]  # fmt: skip
            log = node.dir / "format.log"
            proc = procs.spawn(argv, log, die_with_parent=self.options.die_with_parent)
            running.append((proc, log))
        for proc, log in running:
            if proc.wait(timeout=self.options.start_timeout) != 0:
                raise procs.StartupError(
                    f"StorageTool format failed (exit {proc.returncode}):\n{procs.log_tail(log)}"
                )

    def _quorum_args(self) -> list[str]:
        if len(self._nodes) == 1:
            return ["--standalone"]
        # Every node gets the same list; a node recognises itself by id and stamps its
        # metadata log dir with the directory id given here.
        controllers = ",".join(
            f"{n.node_id}@{LOOPBACK}:{n.controller_port}:{n.directory_id}" for n in self._nodes
        )
        return ["--initial-controllers", controllers]

    def _java_argv(self, heap_max: str | None = None) -> list[str]:
        if self._libs is None:
            raise RuntimeError("jars not resolved; call start() first")
        return [
            self.options.java,
            f"-Xms{self.options.heap_min}",
            f"-Xmx{heap_max or self.options.heap_max}",
            *self.options.jvm_opts,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp",
            f"{self._libs}/*",
        ]

    def _agent_argv(self, node: _Node) -> list[str]:
        """``-javaagent:<jar>=127.0.0.1:<port>:<rules>`` when the node exports metrics."""
        if self._agent is None or node.metrics_port is None:
            return []
        return [f"-javaagent:{self._agent}={LOOPBACK}:{node.metrics_port}:{JMX_EXPORTER_RULES}"]

    def _spawn(self, node: _Node) -> None:
        argv = [
            *self._java_argv(),
            *self._agent_argv(node),
            "kafka.Kafka",
            str(node.properties_file),
        ]
        node.proc = procs.spawn(
            argv, node.log_file, cwd=node.dir, die_with_parent=self.options.die_with_parent
        )

    # -- readiness ---------------------------------------------------------------

    def _wait_ready(self, timeout: float) -> None:
        started = time.monotonic()
        what = f"Kafka ({self.options.brokers} node(s))"
        # Wait for the sockets first: an AdminClient pointed at closed ports logs a
        # "Connection refused" line per retry to stderr.
        procs.wait_until(
            lambda: all(port_is_open(n.client_port) for n in self._nodes if n.running()),
            timeout=timeout,
            what=what,
            alive=self.failed_node,
        )
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            procs.wait_until(
                lambda: self._all_brokers_visible(admin),
                timeout=max(1.0, timeout - (time.monotonic() - started)),
                what=what,
                alive=self.failed_node,
            )
        except procs.StartupError as exc:
            tails = "\n".join(
                f"--- node {n.node_id} ({n.log_file}) ---\n{procs.log_tail(n.log_file)}"
                for n in self._nodes
            )
            raise procs.StartupError(f"{exc}\n{tails}") from None

    def _all_brokers_visible(self, admin: AdminClient) -> bool:
        expected = {n.node_id for n in self._nodes if n.running()}
        try:
            metadata = admin.list_topics(timeout=2)
        except KafkaException:
            return False
        return set(metadata.brokers) >= expected

    def failed_node(self) -> str | None:
        """Describe a node that exited on its own (with its log tail), else None."""
        for node in self._nodes:
            if node.proc is not None and node.proc.poll() is not None:
                if node.down_on_purpose:
                    continue
                return (
                    f"node {node.node_id} exited with {node.proc.returncode}:\n"
                    f"{procs.log_tail(node.log_file)}"
                )
        return None

    # -- helpers -----------------------------------------------------------------

    def _node(self, i: int) -> _Node:
        self._require_started()
        if not 0 <= i < len(self._nodes):
            raise IndexError(f"no broker {i}; the cluster has {len(self._nodes)}")
        return self._nodes[i]

    def _signal(self, i: int, sig: signal.Signals) -> None:
        proc = self._node(i).proc
        if proc is not None:
            procs.signal_group(proc, sig)

    def _require_started(self) -> None:
        if not self._nodes:
            raise RuntimeError("cluster not started")


def _node_properties(node: _Node) -> dict[str, str]:
    return {
        "node.id": str(node.node_id),
        "listeners": (
            f"PLAINTEXT://{LOOPBACK}:{node.client_port},"
            f"CONTROLLER://{LOOPBACK}:{node.controller_port}"
        ),
        # Advertising the controller listener too lets the dynamic quorum reach this node
        # without the "controller listener not advertised" fallback warning.
        "advertised.listeners": (
            f"PLAINTEXT://{LOOPBACK}:{node.client_port},"
            f"CONTROLLER://{LOOPBACK}:{node.controller_port}"
        ),
        "log.dirs": str(node.data_dir),
    }


class KafkaHandle(Protocol):
    """What tests and tools need from a cluster, whether we started it or not."""

    @property
    def bootstrap(self) -> str: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ExternalKafka:
    """A cluster someone else runs (``KAFKA_BOOTSTRAP``); ``stop()`` leaves it alone."""

    bootstrap: str

    def stop(self) -> None:
        """Nothing to do: we did not start it."""


# -- topics --------------------------------------------------------------------------


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    replication: int = 1,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` and wait until every partition's leader serves it; a topic of that
    name already there is an error (a test never reuses another's records).

    A leader in the metadata is not enough: on Kafka 4.1.1 (KRaft) the leader is advertised
    a few hundred milliseconds before it answers ListOffsets for the new partition, and
    records produced in that window can be acknowledged and still be missing from the log
    (seen with a plain idempotent producer and a plain assign() consumer, no mesh involved:
    4 of 25 fresh 24-partition topics lost their first batch; KAFKA-15591, fixed in the
    4.4.0 the pom names). So ``ensure_topic`` waits for ListOffsets too, for older brokers.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    spec = TopicSpec(name, partitions, replication, dict(config or {}))
    if not ensure_topic(admin, spec, timeout=timeout):
        raise KafkaException(
            KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, f"topic {name} already exists")
        )


def delete_topic(bootstrap: str, name: str, timeout: float = 30.0) -> None:
    """Delete ``name`` (a missing topic is fine) and wait until the metadata drops it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics([name], operation_timeout=timeout, request_timeout=timeout)
    error = _future_error(futures[name], timeout)
    if error is not None and error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
        raise error
    procs.wait_until(
        lambda: name not in admin.list_topics(timeout=5).topics,
        timeout=timeout,
        what=f"topic {name} deletion",
    )


def _future_error(future: Future[None], timeout: float) -> KafkaException | None:
    # exception() rather than result(): a raised exception's traceback would pin this
    # frame, and with it the AdminClient, in a cycle only the GC frees; until then the
    # client's threads live on and log every failed reconnect to stderr.
    error = future.exception(timeout=timeout)
    if error is None:
        return None
    if isinstance(error, KafkaException):
        return error
    raise error


class TopicFactory:
    """Creates uniquely named topics (``t-<label>-<8 hex>``) and deletes them all at the end.

    A fresh topic per test keeps tests independent on a shared session broker without
    restarting it (confluent-kafka-python's integration ``cluster_fixture`` pattern).
    """

    def __init__(self, bootstrap: str, label: str) -> None:
        self.bootstrap = bootstrap
        self.label = _topic_slug(label)
        self.created: list[str] = []

    def __call__(
        self,
        partitions: int = 12,
        *,
        replication: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> str:
        name = self.reserve()
        create_topic(self.bootstrap, name, partitions, replication, config)
        return name

    def reserve(self) -> str:
        """A fresh name, not created, deleted at the end like the others (for a test of
        the code that creates it)."""
        name = f"t-{self.label}-{uuid.uuid4().hex[:8]}"
        self.created.append(name)
        return name

    def delete_all(self) -> list[str]:
        """Delete every topic made here; returns the names that could not be deleted."""
        failed = []
        for name in self.created:
            try:
                delete_topic(self.bootstrap, name)
            except (KafkaException, procs.StartupError):
                failed.append(name)
        self.created.clear()
        return failed


def _topic_slug(label: str, max_len: int = 40) -> str:
    # Topic names allow [a-zA-Z0-9._-]; '.' and '_' collide in Kafka's metric names.
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return slug[:max_len].rstrip("-") or "topic"


# -- CLI -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Start a cluster, print its bootstrap, run until SIGINT/SIGTERM, stop it."""
    parser = argparse.ArgumentParser(prog="python -m services.devstack.kafka")
    parser.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    parser.add_argument("--dir", type=Path, default=None, help="data dir (default: temp)")
    parser.add_argument("--port", type=int, default=None, help="client port of broker 0")
    parser.add_argument("--heap", default="512m", help="JVM -Xmx per broker")
    parser.add_argument(
        "--metrics", action="store_true", help="run the JMX exporter agent in each broker"
    )
    args = parser.parse_args(argv)
    options = KafkaOptions(
        brokers=args.brokers,
        base_dir=args.dir,
        port=args.port,
        heap_max=args.heap,
        metrics=args.metrics,
    )
    cluster = KafkaCluster(options)
    started = time.monotonic()
    cluster.start()
    print(f"kafka ready in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print(cluster.bootstrap, flush=True)
    for address in cluster.metrics_addresses:
        print(f"metrics: http://{address}/metrics", file=sys.stderr, flush=True)
    return procs.serve_until_signal(cluster.stop, cluster.failed_node)


if __name__ == "__main__":
    sys.exit(main())
