"""The local stack behind ``dsctl dev up|status|down``.

Everything runs as real processes on loopback: Apache Kafka (KRaft, jars from Maven
Central), optionally a Consul dev agent, the assigner, N sidecars, the notifier (with the
end-to-end probe on) and the probe group's sidecar, and a sample producer. Each runs in
its own session so it outlives ``dsctl dev up --detach``; ``stack.json`` in the state
directory records pids (with their start times, so a reused pid is never signalled) and
ports, and ``down`` stops them in reverse order.

``--secure`` first makes a development PKI in ``pki/`` of the state directory
(:mod:`services.devstack.secure`) and runs every service with TLS and mTLS on its gRPC and
HTTP ports, a token of its own and authorization on; the health checks here go through
the same mTLS.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from services.devstack import procs, secure
from services.devstack.consul import ConsulAgent, ConsulOptions
from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic
from services.devstack.pki import DevPki

DEMO_TOPIC = "ds.demo"
DEMO_GROUP = "demo"
DEMO_PARTITIONS = 12
# The end-to-end probe (services/notifier/probe.py): the notifier creates the topic and the
# group and consumes the probes through their own sidecar, so `dsctl dev up` shows the
# probe's round trip (ds_probe_* on the notifier's /metrics, 7091).
PROBE_TOPIC = "ds.probe"
PROBE_GROUP = "ds-probe"
PROBE_SIDECAR = "sidecar-probe"


def state_dir() -> Path:
    base = os.environ.get("DS_DEV_DIR")
    if base:
        return Path(base)
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "dataservice" / "dev"


@dataclass
class Component:
    name: str
    pid: int
    started: float  # process create_time, to tell a reused pid apart
    log: str
    grpc: str | None = None
    http: str | None = None

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.started) < 1.0 and proc.status() != "zombie"
        except psutil.Error:
            return False

    def healthy(self, tls: ssl.SSLContext | None = None) -> bool | None:
        if self.http is None:
            return None
        url = f"{'https' if tls else 'http'}://{self.http}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1, context=tls) as response:
                return bool(response.status == 200)
        except OSError:
            return False


@dataclass
class Stack:
    dir: str
    bootstrap: str
    consul: str | None
    components: list[Component] = field(default_factory=list)
    pki: str | None = None  # --secure: the directory of the CA, certificates and tokens

    def client_tls(self) -> ssl.SSLContext | None:
        """How dsctl itself reaches the stack's HTTP ports (mTLS with the client
        certificate); None: plaintext."""
        if self.pki is None:
            return None
        pki = DevPki(Path(self.pki))
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(
            pki.cert(secure.CLIENT_CERTIFICATE), pki.key(secure.CLIENT_CERTIFICATE)
        )
        return context

    @classmethod
    def load(cls) -> Stack | None:
        path = state_dir() / "stack.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(
            dir=data["dir"],
            bootstrap=data["bootstrap"],
            consul=data.get("consul"),
            components=[Component(**c) for c in data["components"]],
            pki=data.get("pki"),
        )

    def save(self) -> None:
        path = Path(self.dir) / "stack.json"
        path.write_text(json.dumps(asdict(self), indent=2))

    def status(self) -> dict[str, Any]:
        tls = self.client_tls()
        return {
            "dir": self.dir,
            "bootstrap": self.bootstrap,
            "consul": self.consul,
            "pki": self.pki,
            "components": [
                {
                    **asdict(c),
                    "running": c.alive(),
                    "healthy": c.healthy(tls) if c.alive() else False,
                }
                for c in self.components
            ],
        }


@dataclass(frozen=True)
class UpOptions:
    sidecars: int = 1
    kafka_port: int = 9092
    with_consul: bool = False
    producer_rate: float = 20.0
    timeout: float = 180.0
    spark_distribution: bool = False  # also run spark.jobs.distribution on the demo group
    spark_every: float = 60.0
    probe: bool = True  # run the end-to-end probe (notifier + a sidecar of its group)
    secure: bool = False  # TLS, mTLS, tokens and authorization everywhere (a dev PKI)


def _record(name: str, proc_pid: int, log: Path, grpc: str | None, http: str | None) -> Component:
    started = psutil.Process(proc_pid).create_time()
    return Component(name, proc_pid, started, str(log), grpc, http)


def _sidecar_ports(index: int) -> tuple[int, int]:
    # sidecar-0 gets the documented 7080/7081; more sidecars go above the notifier's 7090s.
    return (7080, 7081) if index == 0 else (7100 + 2 * index, 7101 + 2 * index)


# The probe group's sidecar: next to sidecar-0, below the notifier's 7090s.
PROBE_SIDECAR_PORTS = (7082, 7083)

# The broker's Prometheus JMX exporter (/metrics of kafka_*), the `kafka` job of
# deploy/prometheus/prometheus-static.yml.
KAFKA_METRICS_PORT = 7061


def _notifier_config(root: Path, options: UpOptions) -> Path:
    """The notifier's YAML: the probe on, binding through the stack's assigner."""
    config = root / "notifier.yaml"
    probe = {
        "enabled": options.probe,
        "topic": PROBE_TOPIC,
        "group": PROBE_GROUP,
        "assigner": "127.0.0.1:7070",
    }
    config.write_text(json.dumps({"probe": probe}, indent=2) + "\n")  # JSON is valid YAML
    return config


def up(options: UpOptions, say: Callable[[str], None]) -> Stack:
    existing = Stack.load()
    if existing is not None and any(c.alive() for c in existing.components):
        raise RuntimeError("a dev stack is already running (dsctl dev status); run dsctl dev down")
    root = state_dir()
    logs = root / "logs"
    if root.exists():
        _remove_tree(root)
    logs.mkdir(parents=True)
    stack = Stack(dir=str(root), bootstrap=f"127.0.0.1:{options.kafka_port}", consul=None)
    try:
        _start_all(stack, options, root, logs, say)
    except BaseException:
        say("start failed; stopping what was started")
        down_stack(stack, say)
        raise
    return stack


def _start_all(
    stack: Stack, options: UpOptions, root: Path, logs: Path, say: Callable[[str], None]
) -> None:
    say(f"starting Apache Kafka (KRaft, single node, JMX exporter on :{KAFKA_METRICS_PORT})...")
    cluster = KafkaCluster(
        KafkaOptions(
            base_dir=root / "kafka",
            port=options.kafka_port,
            die_with_parent=False,
            metrics=True,
            metrics_port=KAFKA_METRICS_PORT,
        )
    ).start()
    for i, pid in enumerate(cluster.pids):
        assert pid is not None
        # No http: the exporter's port is plaintext even with --secure, and not a /healthz.
        stack.components.append(_record(f"kafka-{i}", pid, cluster.log_file(i), None, None))
        stack.components[-1].grpc = None
    stack.bootstrap = cluster.bootstrap
    stack.save()
    # Served when this returns: the sample producer writes at once.
    create_topic(stack.bootstrap, DEMO_TOPIC, DEMO_PARTITIONS)

    sidecar_names = [f"sidecar-{i}" for i in range(options.sidecars)]
    pki: DevPki | None = None
    if options.secure:
        say("making a development CA, certificates and tokens (pki/)...")
        served = {**dict.fromkeys(sidecar_names, DEMO_GROUP), PROBE_SIDECAR: PROBE_GROUP}
        pki = secure.make_stack_pki(root / "pki", served, PROBE_GROUP)
        stack.pki = str(pki.directory)
        stack.save()

    if options.with_consul:
        say("starting Consul (dev agent)...")
        # With --secure it presents the dev CA's `consul` certificate in its gRPC checks
        # of the mTLS ports: without one they stay critical, Consul discovery finds no
        # service and the assigner never gets the leader session bound to its check.
        agent = ConsulAgent(
            ConsulOptions(
                base_dir=root / "consul", http_port=8500, die_with_parent=False, check_tls=pki
            )
        ).start()
        assert agent.pid is not None
        stack.consul = agent.http_addr
        stack.components.append(_record("consul", agent.pid, agent.log_file, None, None))
        stack.save()

    config = root / "assigner.yaml"
    config.write_text(f"groups:\n  - name: {DEMO_GROUP}\n    topics: [{DEMO_TOPIC}]\n")
    common = ["--bootstrap", stack.bootstrap, "--log-format", "console"]
    if stack.consul:
        common += ["--consul", stack.consul]
    python = sys.executable
    report_to = ["--notifier", "127.0.0.1:7090"]  # faults of the assigner and sidecars

    def start(name: str, argv: list[str], grpc: int, http: int) -> None:
        log = logs / f"{name}.log"
        env = None if pki is None else {**os.environ, **secure.service_env(pki, name)}
        proc = procs.spawn(argv, log, env=env, die_with_parent=False)
        stack.components.append(
            _record(name, proc.pid, log, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}")
        )
        stack.save()

    say("starting the assigner, notifier and sidecars...")
    start(
        "assigner",
        [
            python,
            "-m",
            "services.assigner",
            *common,
            "--grpc-port",
            "7070",
            "--http-port",
            "7071",
            "--config",
            str(config),
            *report_to,
        ],
        7070,
        7071,
    )
    start(
        "notifier",
        [
            python,
            "-m",
            "services.notifier",
            *common,
            "--grpc-port",
            "7090",
            "--http-port",
            "7091",
            "--outbox-path",
            str(root / "notifier-outbox.sqlite"),
            "--config",
            str(_notifier_config(root, options)),
        ],
        7090,
        7091,
    )

    def start_sidecar(name: str, group: str, grpc: int, http: int) -> None:
        argv = [
            python, "-m", "services.consumer_sidecar", *common,
            "--grpc-port", str(grpc), "--http-port", str(http),
            "--group", group, "--id", name, "--assigner", "127.0.0.1:7070", *report_to,
        ]  # fmt: skip
        start(name, argv, grpc, http)

    for i, name in enumerate(sidecar_names):
        start_sidecar(name, DEMO_GROUP, *_sidecar_ports(i))
    if options.probe:
        start_sidecar(PROBE_SIDECAR, PROBE_GROUP, *PROBE_SIDECAR_PORTS)
    log = logs / "producer.log"
    proc = procs.spawn(
        [
            python,
            "-m",
            "services.dsctl.producer",
            "--bootstrap",
            stack.bootstrap,
            "--topic",
            DEMO_TOPIC,
            "--rate",
            str(options.producer_rate),
        ],
        log,
        die_with_parent=False,
    )
    stack.components.append(_record("producer", proc.pid, log, None, None))
    stack.save()
    if options.spark_distribution:
        say("starting the Spark distribution job (spark.jobs.distribution)...")
        _start_spark_distribution(stack, logs, options.spark_every)

    say("waiting until every service reports SERVING...")
    tls = stack.client_tls()
    deadline = time.monotonic() + options.timeout
    while time.monotonic() < deadline:
        dead = [c.name for c in stack.components if not c.alive()]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited; see the logs in {logs}")
        if all(c.healthy(tls) in (True, None) for c in stack.components):
            return
        time.sleep(0.5)
    pending = [c.name for c in stack.components if c.healthy(tls) is False]
    raise RuntimeError(f"not healthy within {options.timeout:.0f}s: {', '.join(pending)}")


SPARK_DISTRIBUTION = "spark-distribution"


def spark_report(stack: Stack) -> Path:
    return Path(stack.dir) / "spark" / "distribution" / "report.html"


def _start_spark_distribution(stack: Stack, logs: Path, every: float) -> None:
    """The distribution/lag job (spark/jobs/distribution.py) on the demo group through the
    sidecars, redone every ``every`` seconds into ``<state dir>/spark/distribution``."""
    log = logs / f"{SPARK_DISTRIBUTION}.log"
    argv = [
        sys.executable, "-m", "spark.jobs.distribution",
        "--assigner", "127.0.0.1:7070", "--group", DEMO_GROUP,
        "--output", str(spark_report(stack).parent), "--every", str(every),
        "--master", "local[2]", "--shuffle-partitions", "4",
    ]  # fmt: skip
    proc = procs.spawn(argv, log, die_with_parent=False)
    stack.components.append(_record(SPARK_DISTRIBUTION, proc.pid, log, None, None))
    stack.save()


def down_stack(stack: Stack, say: Callable[[str], None]) -> list[str]:
    """Stop every component, newest first; returns the names that had to be killed."""
    killed = []
    for component in reversed(stack.components):
        if not component.alive():
            continue
        say(f"stopping {component.name}...")
        if not _stop_pid(component, timeout=40 if component.name.startswith("kafka") else 20):
            killed.append(component.name)
    path = Path(stack.dir) / "stack.json"
    path.unlink(missing_ok=True)
    return killed


def _stop_pid(component: Component, timeout: float) -> bool:
    """SIGTERM the component's process group, wait, SIGKILL; True if it stopped by itself."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(component.pid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            os.kill(component.pid, sig)
        end = time.monotonic() + (timeout if sig == signal.SIGTERM else 10)
        while time.monotonic() < end:
            if not component.alive():
                return sig == signal.SIGTERM
            time.sleep(0.1)
    return False


def _remove_tree(root: Path) -> None:
    import shutil

    shutil.rmtree(root, ignore_errors=True)
