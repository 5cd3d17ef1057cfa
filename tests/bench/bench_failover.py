"""Benchmark: failover of the mesh against Kafka's own group protocols (issue 22, item 4).

    .venv/bin/python tests/bench/bench_failover.py [--short] [--bootstrap HOST:PORT] [--rows RE]

One Kafka broker (started here unless ``--bootstrap``), a fresh 12-partition topic per
trial with a producer at 300 records/s throughout, three consumers, each a separate OS
process (so ``kill -9`` is real) that writes the monotonic time, partition and offset of
every record it is handed. Faults:

(a) kill -9 of one consumer (for the mesh: its sidecar together with its application,
    the pod dies);
(b) a rolling restart of all three with SIGTERM: each stopped, started again with the
    same identity (sidecar ``--id``, ``group.instance.id``, client id) and waited for
    until it consumes again;
(c) scale-out from three consumers to four;
(d) scale-in from four consumers to three: one stopped with SIGTERM (for the mesh, its
    application and then its sidecar, as a pod's containers stop) and not started again.

Rows: the mesh in leased mode (3 sidecars from ``tests/support/mesh.py``, an application
process per sidecar reading with ``DsClient`` fetch + ack; the client binds to the
group's sidecars) in the assigner's default hold mode, ``hold_mode: handoff`` (row "mesh
leased, hold handoff (default)": no ``DS_HOLD_MODE`` set, the default is what is measured),
and, for comparison, with ``hold_mode: reserve`` asked for (``DS_HOLD_MODE=reserve``);
Kafka's classic group with the eager range assignor, with cooperative-sticky, with static
membership (range + ``group.instance.id``), and the KIP-848 consumer protocol
(``group.protocol=consumer``), each at Kafka's default session timeout (45 s) and at 10 s
(KIP-848's session timeout is the broker's: the group config
``consumer.session.timeout.ms``, allowed down to 10 s on the broker started here).
Kafka consumers keep librdkafka's defaults otherwise (auto commit every 5 s).

Per partition, the gap is the longest time in the fault's window (from the fault until
every partition delivers again, plus 2 s) in which the applications were handed no record
of it, from their own delivery timestamps. ``max`` is the longest over all partitions
(an eager rebalance stops the others too); ``median`` is over the affected ones: (a) the
killed consumer's, (b) all, (c) all, (d) the stopped consumer's. ``dups`` counts records
handed to an application again (same partition and offset) at or after the fault. (d) also
prints ``moves``: the partitions whose owner after the fault is not the one before it (the
mesh: the lease holders the assigner describes; Kafka: which consumer delivered each
partition last before the fault and last in the window); the stopped consumer's partitions
are the least that must move.

``--short`` (CI-sized, about 7 minutes): faults (a) and (b), the mesh rows and the Kafka
rows at the default 45 s only. The full profile (about 25 minutes) runs everything;
``--faults`` runs only the faults named (e.g. ``--faults d``). A
KIP-848 row the client or broker cannot run prints "not supported here: <the error>"; a
row that fails otherwise "failed: <the error>". ``--rows`` runs only the rows whose name
matches a regex (e.g. ``--rows handoff``). Never asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from services.devstack.kafka import KafkaOptions, create_topic, delete_topic
from tests.support.assignment import describe, respawn
from tests.support.bench_kafka import bench_kafka
from tests.support.mesh import REPO, Mesh, ServiceProcess
from tests.support.records import SeqProducer

PARTITIONS = 12
CONSUMERS = 3
RATE = 300.0  # records/s over all partitions
SETTLE = 2.0  # seconds after the last partition delivered again, still in the window
FAULTS = {"a": "kill -9 one", "b": "rolling SIGTERM", "c": "scale 3->4", "d": "scale 4->3"}
# The broker started here lets KIP-848 groups go down to a 10 s session timeout (its
# default minimum is 45 s); the defaults of every row are unchanged.
BROKER_PROPERTIES = {"group.consumer.min.session.timeout.ms": "10000"}


# --- the consumer processes ---------------------------------------------------------


class Stop(Exception):
    """SIGTERM in a consumer process: leave the read loop and close the consumer."""


class _Stopping:
    """SIGTERM raises ``Stop`` at once, except inside ``handling()``: a record handed to the
    application is logged *and* acked (or, in Kafka, its offset stored) before the worker
    leaves, as an application that finishes its batch on SIGTERM does. Raised mid-batch,
    the log would hold records never acked: redelivered to the next holder by design and
    counted as duplicates the mesh did not make."""

    requested = False
    busy = False

    @classmethod
    def on_signal(cls, _sig: int, _frame: FrameType | None) -> None:
        cls.requested = True
        if not cls.busy:
            raise Stop

    @classmethod
    @contextlib.contextmanager
    def handling(cls) -> Iterator[None]:
        cls.busy = True
        try:
            yield
        finally:
            cls.busy = False
        if cls.requested:
            raise Stop


def run_kafka_worker(config: dict[str, str], topic: str, out_path: str) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(config)
    consumer.subscribe([topic])
    with open(out_path, "a", buffering=1) as out:
        try:
            signal.signal(signal.SIGTERM, _Stopping.on_signal)
            while True:
                # poll() stores the offset of what it returns (committed by close()), so
                # the poll and the log line are one step: SIGTERM waits out at most 50 ms.
                with _Stopping.handling():
                    msg = consumer.poll(0.05)
                    if msg is None:
                        continue
                    if msg.error() is not None:
                        print(f"consumer error: {msg.error()}", file=sys.stderr, flush=True)
                        continue
                    out.write(f"{time.monotonic():.4f} {msg.partition()} {msg.offset()}\n")
        except Stop:
            pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            consumer.close()  # leaves the group (a static member does not)


def run_mesh_worker(group: str, assigner: str, client_id: str, out_path: str) -> None:
    from dsclient import DsClient

    with open(out_path, "a", buffering=1) as out:
        try:
            signal.signal(signal.SIGTERM, _Stopping.on_signal)
            with DsClient(group, client_id=client_id, assigner=assigner) as client:
                for batch in client.stream(max_records=100):
                    # A batch SIGTERM cuts before this point was never logged nor acked:
                    # it is redelivered and counted once.
                    with _Stopping.handling():
                        now = time.monotonic()
                        out.write("".join(f"{now:.4f} {r.partition} {r.offset}\n" for r in batch))
                        client.ack(batch)
        except Stop:
            pass


# --- the rows -------------------------------------------------------------------------


@dataclass
class Member:
    """One consumer: its process (and, in the mesh, its sidecar) and its delivery log."""

    name: str
    out: Path
    proc: subprocess.Popen[bytes] | None = None
    sidecar: ServiceProcess | None = None


class Row:
    name: str
    protocol = "mesh"  # or Kafka's group.protocol

    def prepare(self, topics: Mapping[str, str], log_dir: Path) -> None:
        """Before the row's trials: ``topics`` maps each fault to its trial's topic."""

    def finish(self) -> None:
        """After the row's trials."""

    def start(self, member: Member, fault: str) -> None:
        raise NotImplementedError

    def stop(self, member: Member) -> None:
        """SIGTERM and wait (the graceful path)."""
        for proc in self._procs(member):
            proc.send_signal(signal.SIGTERM)
        for proc in self._procs(member):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def kill(self, member: Member) -> None:
        """SIGKILL, every process of the member at once."""
        for proc in self._procs(member):
            proc.kill()
        for proc in self._procs(member):
            proc.wait(10)

    def held_by(self, member: Member, fault: str, since: float) -> set[int]:
        """The partitions ``member`` consumes: those its process was handed since ``since``."""
        return {p for t, p, _ in read_log(member.out) if t > since}

    def owners(self, members: Sequence[Member], fault: str, until: float) -> dict[int, str]:
        """Partition -> the member that consumes it: the one handed it last up to ``until``."""
        last: dict[int, tuple[float, str]] = {}
        for m in members:
            for t, p, _ in read_log(m.out):
                if t <= until and t >= last.get(p, (0.0, ""))[0]:
                    last[p] = (t, m.name)
        return {p: name for p, (_, name) in last.items()}

    def _procs(self, member: Member) -> list[subprocess.Popen[bytes]]:
        return [member.proc] if member.proc is not None else []

    def spawn_worker(self, member: Member, *args: str) -> None:
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", *args]
        argv += ["--out", str(member.out)]
        with (member.out.with_suffix(".log")).open("ab") as log:
            member.proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


class KafkaRow(Row):
    def __init__(
        self, name: str, bootstrap: str, config: Mapping[str, str], static: bool = False
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.config = dict(config)
        self.static = static
        self.protocol = self.config.get("group.protocol", "classic")
        self.group_config: dict[str, str] = {}

    @staticmethod
    def group_of(topic: str) -> str:
        return f"bench-fo-{topic}"

    def prepare(self, topics: Mapping[str, str], log_dir: Path) -> None:
        self.topics = dict(topics)
        if self.group_config:
            from confluent_kafka.admin import (
                AdminClient,
                AlterConfigOpType,
                ConfigEntry,
                ConfigResource,
            )

            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            for topic in topics.values():
                entries = [
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in self.group_config.items()
                ]
                resource = ConfigResource(
                    "group", self.group_of(topic), incremental_configs=entries
                )
                for future in admin.incremental_alter_configs([resource]).values():
                    future.result(timeout=10)

    def start(self, member: Member, fault: str) -> None:
        topic = self.topics[fault]
        config = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group_of(topic),
            "auto.offset.reset": "earliest",
            **self.config,
        }
        if self.static:
            config["group.instance.id"] = member.name
        self.spawn_worker(member, "kafka", "--topic", topic, "--config", json.dumps(config))


class MeshRow(Row):
    def __init__(
        self,
        name: str,
        bootstrap: str,
        hold_mode: str | None,
        sidecar_env: Mapping[str, str] | None = None,
        kafka_group_timing: tuple[float, float] | None = None,
    ) -> None:
        """``hold_mode`` None: the assigner's default (``DS_HOLD_MODE`` unset);
        ``sidecar_env``: the sidecars' own settings (e.g. ``DS_COMMIT_FENCING``);
        ``kafka_group_timing``: (lease TTL, heartbeat interval) s of groups created with
        CreateGroup as ``commit_fencing: kafka`` with that timing of their own."""
        self.name = name
        self.bootstrap = bootstrap
        self.hold_mode = hold_mode
        self.sidecar_env = dict(sidecar_env or {})
        self.kafka_group_timing = kafka_group_timing

    def prepare(self, topics: Mapping[str, str], log_dir: Path) -> None:
        self.groups = {fault: f"bench-fo-{topic}" for fault, topic in topics.items()}
        self.mesh = Mesh(self.bootstrap, log_dir)
        suffix = uuid.uuid4().hex[:6]
        env = {
            # Its own state topic: an earlier row's assigner term must not fence this one.
            "DS_STATE_TOPIC": f"__ds_assigner_state_bench_fo_{suffix}",
            "DS_STATE_TRANSACTIONAL_ID": f"ds-assigner-state-bench-fo-{suffix}",
        }
        if self.hold_mode is not None:
            env["DS_HOLD_MODE"] = self.hold_mode
        seeded = (
            [] if self.kafka_group_timing else [(self.groups[f], [t]) for f, t in topics.items()]
        )
        self.assigner = self.mesh.assigner(seeded, env=env, name=f"assigner-{suffix}")
        self.assigner.wait_serving()
        if self.kafka_group_timing:
            ttl, beat = self.kafka_group_timing
            with grpc.insecure_channel(self.assigner.grpc_addr) as channel:
                admin = admin_pb2_grpc.AdminServiceStub(channel)
                for fault, topic in topics.items():
                    config = types_pb2.GroupConfig(
                        name=self.groups[fault],
                        topics=[topic],
                        mode=common_pb2.GROUP_MODE_LEASED,
                        commit_fencing=types_pb2.COMMIT_FENCING_KAFKA,
                    )
                    config.lease_ttl.FromNanoseconds(int(ttl * 1e9))
                    config.heartbeat_interval.FromNanoseconds(int(beat * 1e9))
                    admin.CreateGroup(admin_pb2.CreateGroupRequest(group=config), timeout=30)

    def finish(self) -> None:
        self.mesh.stop_all()

    def start(self, member: Member, fault: str) -> None:
        if member.sidecar is None:
            member.sidecar = self.mesh.sidecar(
                self.groups[fault], self.assigner, member.name, env=self.sidecar_env
            )
        else:
            member.sidecar = respawn(self.mesh, member.sidecar)  # same id, ports, arguments
        member.sidecar.wait_serving()
        self.spawn_worker(
            member,
            "mesh",
            "--group",
            self.groups[fault],
            "--assigner",
            self.assigner.grpc_addr,
            "--client-id",
            f"app-{member.name}",
        )

    def held_by(self, member: Member, fault: str, since: float) -> set[int]:
        """The partitions of ``member``'s sidecar (every application reads from each of
        the group's sidecars, so its own log says nothing about them)."""
        return {p for p, holder in self._holders(fault).items() if holder == member.name}

    def _holders(self, fault: str) -> dict[int, str]:
        """Partition -> its lease holder, as the assigner describes the group."""
        deadline = time.monotonic() + 30
        while True:  # the assigner may not get Kafka's answer on a loaded machine: again
            try:
                leases = describe(self.assigner.grpc_addr, self.groups[fault]).leases
                return {p: lease.holder for p, lease in leases.items()}
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def owners(self, members: Sequence[Member], fault: str, until: float) -> dict[int, str]:
        """The lease holders now (every application reads from each of the group's
        sidecars: the delivery logs do not say who holds a partition)."""
        return self._holders(fault)

    def stop(self, member: Member) -> None:
        assert member.sidecar is not None
        super().stop(member)  # the application first, as a pod's containers stop together
        member.sidecar.stop()

    def kill(self, member: Member) -> None:
        assert member.sidecar is not None and member.proc is not None
        member.sidecar.signal(signal.SIGKILL)
        member.proc.kill()
        member.proc.wait(10)
        member.sidecar.kill()


def rows(bootstrap: str, short: bool) -> list[Row]:
    mesh: list[Row] = [
        MeshRow("mesh leased, hold handoff (default)", bootstrap, None),
        MeshRow("mesh leased, hold reserve", bootstrap, "reserve"),
        # Issue 36: commits fenced at Kafka (a transactional producer per lease, set up
        # on every grant before the start offset is read: on the failover's path).
        MeshRow(
            "mesh leased, commit fencing kafka",
            bootstrap,
            None,
            sidecar_env={"DS_COMMIT_FENCING": "kafka"},
        ),
        # Issue 36 item 2: a kafka-fenced group's own failure detection (TTL + grace 2.5 s).
        MeshRow(
            "mesh leased, kafka group TTL 1.5s/0.5s",
            bootstrap,
            None,
            kafka_group_timing=(1.5, 0.5),
        ),
    ]
    kafka: list[Row] = []
    for timeout in (45, 10) if not short else (45,):
        session = {"session.timeout.ms": str(timeout * 1000)}
        kafka += [
            KafkaRow(
                f"classic range (eager), {timeout}s",
                bootstrap,
                {"partition.assignment.strategy": "range", **session},
            ),
            KafkaRow(
                f"classic cooperative-sticky, {timeout}s",
                bootstrap,
                {"partition.assignment.strategy": "cooperative-sticky", **session},
            ),
            KafkaRow(
                f"classic static membership, {timeout}s",
                bootstrap,
                {"partition.assignment.strategy": "range", **session},
                static=True,
            ),
        ]
        consumer = KafkaRow(
            f"KIP-848 consumer, {timeout}s", bootstrap, {"group.protocol": "consumer"}
        )
        if timeout != 45:
            consumer.group_config = {"consumer.session.timeout.ms": str(timeout * 1000)}
        kafka.append(consumer)
    return mesh + kafka


# --- a trial --------------------------------------------------------------------------


def read_log(path: Path) -> list[tuple[float, int, int]]:
    deliveries = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:  # a line cut by a kill has fewer
                deliveries.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return deliveries


@dataclass
class Trial:
    row: Row
    fault: str
    log_dir: Path
    members: list[Member] = field(default_factory=list)

    def deliveries(self) -> list[tuple[float, int, int]]:
        found = [d for m in self.members for d in read_log(m.out)]
        return sorted(found)

    def member(self, i: int) -> Member:
        member = Member(f"{self.fault}c{i}", self.log_dir / f"{self.fault}-c{i}.txt")
        self.members.append(member)
        self.row.start(member, self.fault)
        return member

    def last_seen(self) -> dict[int, float]:
        seen: dict[int, float] = {}
        for t, p, _ in self.deliveries():
            seen[p] = t
        return seen

    def wait_flowing(self, since: float, members: Sequence[Member], timeout: float) -> None:
        """Until every partition delivered after ``since`` and in the last second, and each
        of ``members`` delivered after ``since`` (it consumes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.monotonic()
            seen = self.last_seen()
            flowing = all(seen.get(p, 0.0) > max(since, now - 1.0) for p in range(PARTITIONS))
            consuming = all(any(t > since for t, _, _ in read_log(m.out)) for m in members)
            if flowing and consuming:
                return
            time.sleep(0.2)
        said = [
            f"{m.name}: {(m.out.with_suffix('.log').read_text(errors='replace').strip() or '-')}"
            for m in self.members
            if m.out.with_suffix(".log").exists()
        ]
        raise TimeoutError(
            f"not every partition delivering within {timeout:.0f}s; the consumers said: "
            + "; ".join(s[-300:] for s in said)
        )

    def run(self) -> tuple[list[float], list[float], int, int]:
        """Start three consumers (four for (d)), apply the fault; returns (gaps of all
        partitions, gaps of the affected ones, duplicates, partitions moved)."""
        members = [self.member(i) for i in range(CONSUMERS + (self.fault == "d"))]
        self.wait_flowing(0.0, members, timeout=120)
        time.sleep(3)  # the joins' rebalances are over
        self.wait_flowing(time.monotonic() - 1, [], timeout=60)
        t0 = time.monotonic()
        before = self.row.owners(members, self.fault, t0)
        affected = set(range(PARTITIONS))
        if self.fault == "a":
            victim = members[0]
            affected = self.row.held_by(victim, self.fault, t0 - 2.0)
            self.row.kill(victim)
            self.wait_flowing(time.monotonic(), [], timeout=180)
        elif self.fault == "b":
            for m in members:
                self.row.stop(m)
                m.out.rename(m.out.with_suffix(f".{time.monotonic():.0f}.txt"))
                restarted = time.monotonic()
                self.row.start(m, self.fault)
                self.wait_flowing(restarted, [m], timeout=180)
        elif self.fault == "c":
            added = self.member(CONSUMERS)
            self.wait_flowing(t0, [added], timeout=180)
        else:
            leaving = members[-1]
            affected = self.row.held_by(leaving, self.fault, t0 - 2.0)
            self.row.stop(leaving)
            self.wait_flowing(time.monotonic(), [], timeout=180)
        time.sleep(SETTLE)
        end = time.monotonic()
        after = self.row.owners(self.members, self.fault, end)
        moves = sum(1 for p in range(PARTITIONS) if before.get(p) != after.get(p))
        deliveries = [d for p in self.log_dir.glob(f"{self.fault}-c*.txt") for d in read_log(p)]
        times: dict[int, list[float]] = defaultdict(list)
        copies: dict[tuple[int, int], list[float]] = defaultdict(list)
        for t, p, o in sorted(deliveries):
            if t0 <= t <= end:
                times[p].append(t)
            copies[(p, o)].append(t)
        # A copy after the first, handed over at or after the fault.
        dups = sum(1 for ts in copies.values() for t in ts[1:] if t >= t0)
        gaps = {}
        for p in range(PARTITIONS):
            points = [t0, *times[p], end]
            gaps[p] = max(b - a for a, b in itertools.pairwise(points))
        return list(gaps.values()), [gaps[p] for p in sorted(affected)], dups, moves

    def cleanup(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait(10)
            if m.sidecar is not None:
                m.sidecar.kill()


def trial_cell(row: Row, fault: str, log_dir: Path) -> str:
    trial = Trial(row, fault, log_dir)
    try:
        everything, affected, dups, moves = trial.run()
    finally:
        trial.cleanup()
    cell = f"{max(everything):6.1f}s {statistics.median(affected):6.1f}s {dups:5d}"
    return cell + (f" {moves:5d}" if fault == "d" else "")


def cell_width(fault: str) -> int:
    return 27 if fault == "d" else 21  # (d) has a moves column


@contextlib.contextmanager
def producing(bootstrap: str, topic: str) -> Iterator[None]:
    producer = SeqProducer(bootstrap, topic, PARTITIONS, rate=RATE).start()
    try:
        yield
    finally:
        producer.stop()


def run(
    bootstrap: str,
    short: bool,
    log_dir: Path,
    only: str | None = None,
    faults: Sequence[str] | None = None,
) -> None:
    faults = list(faults or (["a", "b"] if short else FAULTS))
    print(
        f"{PARTITIONS} partitions, {CONSUMERS} consumers (separate processes), {RATE:.0f} "
        "records/s; per cell: the longest per-partition gap over all partitions, the median "
        "over the affected ones, duplicates delivered after the fault; load average "
        f"(1 min) at the start {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    header = f"{'row':40}" + "".join(f" | ({f}) {FAULTS[f]:>{cell_width(f) - 4}}" for f in faults)
    sub = f"{'':40}" + "".join(
        f" | {'max':>7} {'median':>7} {'dups':>5}" + (f" {'moves':>5}" if f == "d" else "")
        for f in faults
    )
    lines = [header, sub, "-" * len(sub)]
    for row in rows(bootstrap, short):
        if only is not None and not re.search(only, row.name):
            continue
        started = time.monotonic()
        topics = {f: f"bench-fo-{uuid.uuid4().hex[:8]}" for f in faults}
        for topic in topics.values():
            create_topic(bootstrap, topic, PARTITIONS)
        row_dir = log_dir / uuid.uuid4().hex[:6]
        row_dir.mkdir()
        cells: list[str] = []
        try:
            row.prepare(topics, row_dir)
            for fault in faults:
                with producing(bootstrap, topics[fault]):
                    cells.append(trial_cell(row, fault, row_dir))
            line = f"{row.name:40}" + "".join(
                f" | {c:>{cell_width(f)}}" for f, c in zip(faults, cells, strict=True)
            )
        except Exception as exc:  # a row that cannot run here is reported, not fatal
            error = " ".join(str(exc).split())[:160]
            # A client or broker without the protocol says so at once; anything else
            # failed here.
            label = "not supported here" if row.protocol == "consumer" else "failed"
            line = f"{row.name:40} | {label}: {error}"
        finally:
            row.finish()
            for topic in topics.values():
                with contextlib.suppress(Exception):
                    delete_topic(bootstrap, topic)
        lines.append(line)
        print(
            f"{line}   ({time.monotonic() - started:.0f}s, load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    lines.append(f"load average (1/5/15 min) at the end: {fmt_load(os.getloadavg())}")
    print("\n" + "\n".join(lines), flush=True)


def fmt_load(load: tuple[float, float, float]) -> str:
    return " / ".join(f"{x:.1f}" for x in load)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument("--rows", help="only the rows whose name matches this regex")
    parser.add_argument(
        "--faults", help="only these faults, e.g. 'd' or 'bd' (default: all; --short: ab)"
    )
    parser.add_argument("--worker", choices=("kafka", "mesh"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--assigner", help=argparse.SUPPRESS)
    parser.add_argument("--client-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "kafka":
        run_kafka_worker(json.loads(args.config), args.topic, args.out)
        return 0
    if args.worker == "mesh":
        run_mesh_worker(args.group, args.assigner, args.client_id, args.out)
        return 0
    if "DS_HOLD_MODE" in os.environ:
        # The default-mode mesh row measures the default, not a mode inherited from here.
        parser.error("unset DS_HOLD_MODE: the mesh rows choose their hold mode themselves")
    started = time.monotonic()
    options = KafkaOptions(brokers=1, properties=BROKER_PROPERTIES)
    with (
        bench_kafka(args.bootstrap, options=options, announce=True) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp,
    ):
        faults = list(args.faults) if args.faults else None
        if faults and not set(faults) <= set(FAULTS):
            parser.error(f"--faults: each of {''.join(FAULTS)}")
        run(kafka.bootstrap, args.short, Path(tmp), args.rows, faults)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
