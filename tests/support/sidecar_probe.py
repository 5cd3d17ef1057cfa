"""Look inside a running sidecar from a test: its Status, its RSS, the commits it made.

``start_sidecar`` starts a sidecar like :meth:`Mesh.sidecar` but with extra environment
(``DS_KAFKA__…``, ``DS_STATISTICS_INTERVAL_MS``…). ``CommitWatcher`` polls the group's
committed offsets *with their metadata* (``{"epoch": N, "sidecar": id}``, ARCHITECTURE
§3.1.6) so a test can tell who committed what and when. ``RssSampler`` samples a process's
resident memory. ``produce_bulk`` writes a large backlog fast (idempotent, batched).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import psutil
import yaml
from confluent_kafka import Consumer, Producer

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.devstack.ports import free_ports
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.offsets import committed_partitions, group_reader


def start_sidecar(
    mesh: Mesh,
    group: str,
    assigner: ServiceProcess,
    sidecar_id: str,
    *args: str,
    env: Mapping[str, str] | None = None,
) -> ServiceProcess:
    """:meth:`Mesh.sidecar` with extra environment variables; stopped with the mesh."""
    grpc_port, http_port = free_ports(2)
    argv = [*mesh._common(), "--group", group, "--id", sidecar_id]
    argv += ["--assigner", assigner.grpc_addr, *args]
    svc = ServiceProcess(
        "sidecar", argv, mesh.log_dir / f"{sidecar_id}.log", grpc_port, http_port, dict(env or {})
    )
    mesh.services.append(svc)
    return svc.start()


def kafka_config_file(path: str | object, kafka: Mapping[str, str]) -> str:
    """A sidecar ``--config`` YAML file whose ``kafka:`` map passes librdkafka settings."""
    text = yaml.safe_dump({"kafka": {k: str(v) for k, v in kafka.items()}})
    with open(str(path), "w") as out:
        out.write(text)
    return str(path)


def status(addr: str, timeout: float = 5.0) -> stream_pb2.StatusResponse:
    with grpc.insecure_channel(addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        return stub.Status(stream_pb2.StatusRequest(), timeout=timeout)


@dataclass(frozen=True)
class Commit:
    """One committed offset as Kafka reports it, with the metadata's epoch and sidecar."""

    offset: int
    epoch: int | None
    sidecar: str | None
    raw: str


def parse_commit(offset: int, metadata: str | None) -> Commit:
    raw = metadata or ""
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        meta = {}
    epoch = meta.get("epoch") if isinstance(meta, dict) else None
    sidecar = meta.get("sidecar") if isinstance(meta, dict) else None
    return Commit(offset, epoch, sidecar, raw)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, Commit]:
    """The group's committed offsets of ``topic`` with their metadata (offset -1001 = none)."""
    return {
        tp.partition: parse_commit(tp.offset, getattr(tp, "metadata", None))
        for tp in committed_partitions(bootstrap, group, topic, partitions)
    }


@dataclass
class CommitWatcher:
    """Polls :func:`committed` every ``interval`` s; keeps every change per partition as
    (monotonic time first seen, Commit). Failed polls are counted and skipped."""

    bootstrap: str
    group: str
    topic: str
    partitions: int
    interval: float = 0.1
    history: dict[int, list[tuple[float, Commit]]] = field(default_factory=dict)
    failed_polls: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="commit-watch", daemon=True)

    def start(self) -> CommitWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        reader = group_reader(self.bootstrap, self.group)
        try:
            self._poll(reader)
        finally:
            reader.close()

    def _poll(self, reader: Consumer) -> None:
        while not self._stop.is_set():
            try:
                listed = committed_partitions(
                    self.bootstrap, self.group, self.topic, self.partitions, reader=reader
                )
            except Exception:  # a poll that fails is retried; the count is reported
                self.failed_polls += 1
                self._stop.wait(self.interval)
                continue
            now = time.monotonic()
            with self._lock:
                for tp in listed:
                    commit = parse_commit(tp.offset, getattr(tp, "metadata", None))
                    seq = self.history.setdefault(tp.partition, [])
                    if not seq or seq[-1][1] != commit:
                        seq.append((now, commit))
            self._stop.wait(self.interval)

    def changes(self, partition: int) -> list[tuple[float, Commit]]:
        with self._lock:
            return list(self.history.get(partition, []))


def zombie_commit_problems(
    commits: CommitWatcher,
    partitions: int,
    zombie_epochs: Mapping[int, int],
    stopped_at: float,
    resumed_at: float,
) -> list[str]:
    """What the commit history shows wrong around a zombie: on any partition an offset or an
    epoch going back; on the zombie's partitions (``zombie_epochs``: each one's epoch when it
    was stopped) a commit by the zombie under that epoch once the survivor had committed, or
    after it was resumed."""
    problems: list[str] = []
    for p in range(partitions):
        changes = commits.changes(p)
        survivor_seen = False
        for i, (t, c) in enumerate(changes):
            if i:
                prev = changes[i - 1][1]
                if c.offset < prev.offset or (c.epoch or 0) < (prev.epoch or 0):
                    problems.append(f"p{p} went back {prev.raw}@{prev.offset}->{c}")
            if p not in zombie_epochs:
                continue
            if c.sidecar == "survivor":
                survivor_seen = True
            elif (
                c.sidecar == "zombie"
                and c.epoch == zombie_epochs[p]
                and (survivor_seen or t >= resumed_at)
            ):
                problems.append(f"p{p} zombie commit {c} at +{t - stopped_at:.2f}s")
    return problems


def final_commits_not_the_survivors(
    final: Mapping[int, Commit], new_epochs: Mapping[int, int]
) -> dict[int, Commit]:
    """The zombie's partitions (``new_epochs``: each one's epoch once moved) whose last commit
    is under an older epoch, or under the new one by another sidecar than the survivor."""
    return {
        p: final[p]
        for p, epoch in new_epochs.items()
        if (final[p].epoch or 0) < epoch
        or (final[p].epoch == epoch and final[p].sidecar != "survivor")
    }


class RssSampler:
    """Samples ``pid``'s resident set size every ``interval`` s on a thread."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.rss()))
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def max_since(self, since: float = 0.0) -> int:
        return max((rss for t, rss in self.samples if t >= since), default=0)


def produce_bulk(
    bootstrap: str,
    topic: str,
    count: int,
    value_size: int,
    partitions: int,
    *,
    stamp: bool = False,
) -> float:
    """Produce ``count`` records of ``value_size`` bytes (key = sequence number), spread
    round-robin over ``partitions``, idempotent and batched; returns the seconds taken.
    With ``stamp`` the value starts with the produce time (``time.time_ns()``)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "queue.buffering.max.kbytes": 1_048_576,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    filler = b"x" * value_size
    started = time.monotonic()
    for seq in range(count):
        value = filler
        if stamp:
            head = b"%d:" % time.time_ns()
            value = head + filler[len(head) :]
        while True:
            try:
                producer.produce(topic, key=b"%d" % seq, value=value, partition=seq % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if seq % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    assert remaining == 0, f"{remaining} records not confirmed by Kafka"
    return time.monotonic() - started
