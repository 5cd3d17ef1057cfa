"""The chaos suite's harness (issue 17, ``tests/chaos/``): the mesh carrying traffic on the
3-broker cluster while a scenario breaks something, and the accounting every scenario ends
with.

:class:`LoadedMesh` starts, on a topic with 3 replicas and ``min.insync.replicas=2``: an
assigner (its state topic gets 3 replicas and min.insync 2 on its own on this cluster),
three sidecars, optionally a notifier (its faults topic with 3 replicas), a producer
writing throughout (idempotent, so acks=all), two bound ``DsClient`` loops acking every
batch, a watcher of the group's committed offsets (every 100 ms, from Kafka) and a sampler
of who holds each partition (every 100 ms, from the sidecars). :meth:`LoadedMesh.finish`
stops the producer, waits until every confirmed record was received and every partition's
committed offset reached its end, and returns an :class:`Accounting`: produced, received,
lost, duplicates (explained: delivered and not acked at the fault; unexplained: delivered
again although an earlier delivery's ack was accepted), committed offsets or epochs that
went backwards, two live holders at a sampled moment, and the longest time without
consumption per partition in each phase of the scenario.

Optional parts for the scenarios that need them: a Consul agent's address (the services
and clients find the leader through it), two assigner replicas electing a leader (the
sidecars and clients start on the leader; :meth:`LoadedMesh.leaders` says who leads now),
a group visibility timeout, further clients (:meth:`LoadedMesh.add_client`) and an
application container that a scenario kills (:meth:`LoadedMesh.start_app`): what it had
acked counts as received, what it had and did not ack must reach a client again, and a
record delivered to it and again elsewhere is a duplicate explained only if it was not
acked at the kill.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc

from dsclient import DsClient
from services.devstack.kafka import KafkaCluster, TopicFactory
from tests.support.app_process import AppContainer, AppLog
from tests.support.assignment import describe, wait_stable
from tests.support.holders import HolderSampler
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.offsets import committed_offsets, end_offsets
from tests.support.ops import (
    describe_deliveries,
    metric_samples,
    metrics,
    samples_in,
    unexplained_duplicates,
)
from tests.support.records import (
    ConsumerLoop,
    Delivery,
    SeqProducer,
    Tally,
    describe_missing,
    partition_gaps,
)
from tests.support.sidecar_probe import CommitWatcher, status
from tests.support.waiting import wait_for

PARTITIONS = 6
SIDECARS = ("cx-1", "cx-2", "cx-3")
CLIENTS = ("cx-app-1", "cx-app-2")
STATE_TOPIC = "__ds_assigner_state"
# What a rolling restart waits for before the next broker goes: every replica back in sync.
INTERNAL_TOPICS = (STATE_TOPIC, "__consumer_offsets", "__transaction_state")


@dataclass
class Accounting:
    """What a scenario's records and commits came to (see the module doc)."""

    produced: int
    received: int
    lost: set[int]
    lost_text: str
    duplicates: int  # deliveries beyond the first, over all records
    unexplained: dict[int, list[Delivery]]
    not_at_end: dict[int, tuple[int, int]]  # partition -> (committed, end offset)
    commits_backwards: list[tuple[int, int, int]]
    epochs_backwards: list[tuple[int, int, int]]
    commit_samples: int
    holder_samples: int
    double_holders: list[tuple[float, int, list[str]]]
    gaps: dict[str, dict[int, float]]  # phase -> partition -> longest time without a delivery
    client_errors: list[BaseException] = field(default_factory=list)
    # Records the sidecars made due again, by reason (ds_sidecar_redeliveries_total), and
    # the unexplained duplicates' deliveries, told in full: what a failure is read from.
    redeliveries: dict[str, float] = field(default_factory=dict)
    unexplained_text: str = ""
    # Sequences Kafka holds at more than one offset (the producer's retry across an outage):
    # two records to the mesh, not a redelivery (``tests.support.ops.producer_copies``).
    producer_copies: int = 0
    # The producer replaced after confirming nothing for its stall time (records.py).
    producer_renewals: int = 0

    def line(self, label: str) -> str:
        """The scenario's one summary line."""
        gaps = "; ".join(
            f"{phase} {max(per.values(), default=0.0):.1f}s (p{max(per, key=per.__getitem__)})"
            if per
            else f"{phase} -"
            for phase, per in self.gaps.items()
        )
        return (
            f"chaos {label}: produced {self.produced}, received {self.received}, lost "
            f"{len(self.lost)}, duplicates {self.duplicates} (unexplained "
            f"{len(self.unexplained)}: the rest were delivered and not acked at a fault); "
            f"partitions not committed to their end {len(self.not_at_end)}; committed "
            f"offsets backwards {len(self.commits_backwards)}, commit epochs backwards "
            f"{len(self.epochs_backwards)} ({self.commit_samples} commit changes seen); two "
            f"live holders {len(self.double_holders)} of {self.holder_samples} samples; max "
            f"time with no consumption per partition: {gaps}; client errors "
            f"{len(self.client_errors)}; made due again by the sidecars: "
            f"{self._redeliveries_text()}; written twice to Kafka by the producer "
            f"{self.producer_copies}"
            + (
                f" (the producer replaced {self.producer_renewals}x after a stall)"
                if self.producer_renewals
                else ""
            )
        )

    def _redeliveries_text(self) -> str:
        counted = {reason: n for reason, n in self.redeliveries.items() if n}
        return ", ".join(f"{n:.0f} {reason}" for reason, n in sorted(counted.items())) or "none"

    def check(self) -> None:
        assert not self.client_errors, self.client_errors[:3]
        assert not self.lost, self.lost_text
        assert not self.not_at_end, f"not read to the end (committed, end): {self.not_at_end}"
        assert not self.unexplained, (
            f"unexplained duplicates: {sorted(self.unexplained)[:10]}: {self.unexplained_text}; "
            f"made due again by the sidecars: {self._redeliveries_text()}"
        )
        assert not self.commits_backwards, f"committed offsets backwards {self.commits_backwards}"
        assert not self.epochs_backwards, f"commit epochs backwards {self.epochs_backwards}"
        assert self.holder_samples > 50, self.holder_samples
        assert not self.double_holders, f"two live holders: {self.double_holders[:5]}"


class LoadedMesh:
    """The mesh under load on ``cluster`` for one scenario (see the module doc)."""

    def __init__(
        self,
        cluster: KafkaCluster,
        log_dir: Path,
        label: str,
        *,
        with_notifier: bool = False,
        rate: float = 200.0,
        consul: str | None = None,
        assigners: int = 1,
        visibility_timeout: float | None = None,
    ) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.label = label
        self.with_notifier = with_notifier
        self.rate = rate
        self.consul = consul
        self.replicas = assigners
        self.visibility_timeout = visibility_timeout
        self.group = f"cx-{uuid.uuid4().hex[:8]}"
        self.tally = Tally()
        self.loops: list[ConsumerLoop] = []
        self.sidecars: list[ServiceProcess] = []
        self.notifier: ServiceProcess | None = None
        self.assigners: list[ServiceProcess] = []
        self.apps: list[AppContainer] = []
        self.phases: dict[str, tuple[float, float]] = {}
        self._exit = contextlib.ExitStack()
        self._produced: set[int] | None = None

    # ---- set-up ----------------------------------------------------------------------

    def __enter__(self) -> LoadedMesh:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit.close()

    def _start(self) -> None:
        bootstrap = self.cluster.bootstrap
        topics = TopicFactory(bootstrap, self.label)
        self._exit.callback(topics.delete_all)
        self.topic = topics(PARTITIONS, replication=3, config={"min.insync.replicas": "2"})
        self.mesh: Mesh = self._exit.enter_context(
            running_mesh(bootstrap, self.log_dir, consul=self.consul)
        )
        self._exit.callback(self._stop_services)
        extra: tuple[str, ...] = ()
        if self.with_notifier:
            self.notifier = self.mesh.service("notifier", env={"DS_FAULTS_TOPIC_REPLICATION": "3"})
            self.notifier.wait_serving(90)
            extra = ("--notifier", self.notifier.grpc_addr)
        self._extra = extra
        settings = (
            {"visibility_timeout_seconds": f"{self.visibility_timeout:g}"}
            if self.visibility_timeout is not None
            else None
        )
        for i in range(1, self.replicas + 1):
            name = f"assigner-{i}" if self.replicas > 1 else None
            self.assigners.append(
                self.mesh.assigner(
                    [(self.group, [self.topic])], *extra, name=name, settings=settings
                )
            )
        # The sidecars start with the assigners (not once they serve: both take seconds on
        # a loaded box); any replica's address will do, a sidecar follows the leader.
        for sid in SIDECARS:
            self.sidecars.append(self.mesh.sidecar(self.group, self.assigners[0], sid, *extra))
        for replica in self.assigners:
            replica.wait_serving(90)
        wait_for(lambda: len(self.leaders()) == 1, 60, "one assigner replica leads the group")
        (self.assigner,) = self.leaders()
        for sidecar in self.sidecars:
            sidecar.wait_serving(90)
        wait_stable(self.assigner.grpc_addr, self.group, SIDECARS, PARTITIONS, timeout=90)

        self.producer = SeqProducer(bootstrap, self.topic, PARTITIONS, rate=self.rate).start()
        self._exit.callback(self._stop_producer)
        self.commits = CommitWatcher(bootstrap, self.group, self.topic, PARTITIONS).start()
        self._exit.callback(self.commits.stop)
        self.holders = self._exit.enter_context(HolderSampler(self.sidecars))
        for client_id in CLIENTS:
            self.add_client(client_id)
        self.wait_flowing(300, "records flowing before the fault")
        self.started = time.monotonic()

    def _stop_producer(self) -> set[int]:
        if self._produced is None:
            self._produced = self.producer.stop()
        return self._produced

    def _stop_services(self) -> None:
        """Stop the sidecars all at once, then the assigner replicas all at once, before
        the rest of the mesh: each takes seconds to stop gracefully on a loaded box, one
        after the other they took 15 s."""
        for services in (self.sidecars, self.assigners):
            with ThreadPoolExecutor(max_workers=len(services) or 1) as pool:
                list(pool.map(ServiceProcess.stop, services))

    def add_sidecar(self, sidecar_id: str) -> ServiceProcess:
        """A sidecar joining the group now; sampled for holders like the others."""
        sidecar = self.mesh.sidecar(self.group, self.assigner, sidecar_id, *self._extra)
        self.sidecars.append(sidecar)  # the HolderSampler's list: sampled from now on
        return sidecar

    def add_client(self, client_id: str) -> ConsumerLoop:
        """A bound client fetching and acking into the tally from now on."""
        client = DsClient(
            self.group, client_id=client_id, assigner=self.assigner.grpc_addr, consul=self.consul
        )
        self._exit.callback(client.close)
        loop = ConsumerLoop(client, self.tally, max_records=100).start()
        self._exit.callback(loop.stop)
        self.loops.append(loop)
        return loop

    def start_app(self, client_id: str, *, ack_for: float, stream: bool = False) -> AppContainer:
        """An application container (tests/support/app_process.py) reading the group as
        ``client_id``: it acks for ``ack_for`` seconds, then holds what it reads until the
        scenario kills it; :meth:`finish` accounts for what it received."""
        app = AppContainer(
            self.group,
            self.assigner.grpc_addr,
            client_id,
            self.log_dir / f"{client_id}-{len(self.apps)}.out",
            self.log_dir / f"{client_id}.log",
            ack_for=ack_for,
            stream=stream,
        )
        self._exit.callback(app.kill)
        self.apps.append(app)
        return app

    def members(self, replica: ServiceProcess) -> set[str] | None:
        """The group's members if ``replica`` leads and serves the group, else None."""
        try:
            # 5 s: a leader busy taking over on a loaded box took more than 2 s to answer.
            return set(describe(replica.grpc_addr, self.group, timeout=5.0).members)
        except grpc.RpcError:
            return None

    def leaders(self) -> list[ServiceProcess]:
        """The assigner replicas serving the group now (one, unless something is wrong)."""
        return [r for r in self.assigners if self.members(r) is not None]

    # ---- during the scenario -----------------------------------------------------------

    def wait_flowing(self, more: int, what: str, timeout: float = 90) -> float:
        """Wait until ``more`` further records were received; returns the seconds taken."""
        started = time.monotonic()
        target = len(self.tally.received()) + more
        wait_for(lambda: len(self.tally.received()) >= target, timeout, what)
        return time.monotonic() - started

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a phase of the scenario: its longest time without consumption is reported."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = (started, time.monotonic())

    def wait_replicated(self, timeout: float = 120) -> None:
        """Every replica of the test's topic and of the internal topics back in sync."""
        for topic in (self.topic, *INTERNAL_TOPICS):
            wait_for(
                lambda t=topic: self.cluster.fully_replicated(t),  # type: ignore[misc]
                timeout,
                f"every replica of {topic} in sync",
                every=0.5,
            )

    # ---- the end -------------------------------------------------------------------------

    def finish(self, timeout: float = 120) -> Accounting:
        """Stop producing; wait until every record was received and every partition's
        committed offset reached its end; stop the loops and watchers; count."""
        produced = self._stop_producer()
        apps = [app.kill() for app in self.apps]
        # What a killed application acked (or may have: an ack unanswered at the kill) is
        # done; everything else must reach the tally.
        done = set().union(*(app.acked | app.partly for app in apps))
        deadline = time.monotonic() + timeout
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: produced - done <= self.tally.received(), timeout, "every record received"
            )
        ended = time.monotonic()
        bootstrap = self.cluster.bootstrap
        ends = end_offsets(bootstrap, self.topic, PARTITIONS)
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: committed_offsets(bootstrap, self.group, self.topic, PARTITIONS) == ends,
                max(5.0, deadline - time.monotonic()),
                "every partition committed to its end",
                every=0.5,
            )
        committed = committed_offsets(bootstrap, self.group, self.topic, PARTITIONS)
        # Where a partition that did not reach its end stands, asked while everything still
        # runs (the sidecars' own view, their not-fetching gauges, each client's binding):
        # a stall must say where it is (CI, 4 Dec: two partitions of one sidecar).
        stuck = produced - done - self.tally.received() or any(
            committed[p] != e for p, e in ends.items()
        )
        states = self._states() if stuck else ""
        for loop in self.loops:
            loop.stop()
        redeliveries = self._scrape_redeliveries()
        self.commits.stop()
        self.holders.__exit__(None, None, None)

        received = self.tally.received()
        lost = produced - received - done
        received |= {d[0] for app in apps for d in app.deliveries}
        lost_text = describe_missing(lost, PARTITIONS, producer=self.producer, tally=self.tally)
        if states:
            lost_text += f"\n  where the mesh stood: {states}"
        commits_backwards, epochs_backwards, changes = [], [], 0
        for p in range(PARTITIONS):
            history = [c for _, c in self.commits.changes(p) if c.offset >= 0]
            changes += len(history)
            for a, b in itertools.pairwise(history):
                if b.offset < a.offset:
                    commits_backwards.append((p, a.offset, b.offset))
                if a.epoch is not None and b.epoch is not None and b.epoch < a.epoch:
                    epochs_backwards.append((p, a.epoch, b.epoch))
        unexplained = self._unexplained(apps)
        phases = dict(self.phases)
        phases["after"] = (max((e for _, e in self.phases.values()), default=self.started), ended)
        return Accounting(
            produced=len(produced),
            received=len(received & produced),
            lost=lost,
            lost_text=lost_text,
            duplicates=self._duplicates(apps),
            producer_copies=sum(
                n > 1 for n in Counter(seq for seq, _, _ in self._deliveries(apps)).values()
            ),
            producer_renewals=self.producer.renewals,
            unexplained=unexplained,
            not_at_end={p: (committed[p], e) for p, e in ends.items() if committed[p] != e},
            commits_backwards=commits_backwards,
            epochs_backwards=epochs_backwards,
            commit_samples=changes,
            holder_samples=self.holders.samples,
            double_holders=list(self.holders.double),
            gaps={
                name: partition_gaps(self.tally, a, b, PARTITIONS)
                for name, (a, b) in phases.items()
            },
            client_errors=[e for loop in self.loops for e in loop.errors],
            redeliveries=redeliveries,
            unexplained_text=" | ".join(
                f"seq {seq}: {describe_deliveries(ds, self.started)}"
                for seq, ds in sorted(unexplained.items())[:5]
            ),
        )

    def _states(self) -> str:
        """Each sidecar's held partitions (Status: epoch, position, committed offset, high
        watermark, buffered, paused, in flight, due), not-fetching gauges, last poll and
        broker connections (one scrape), and each client's bound sidecars, as one line
        each; where py-spy is installed (not in CI), every thread's stack of each sidecar
        in a file beside its log."""
        lines = []
        spy = shutil.which("py-spy")
        for sidecar in self.sidecars:
            name = sidecar.log.stem
            try:
                answer = status(sidecar.grpc_addr)
            except grpc.RpcError as err:
                lines.append(f"{name}: Status failed: {err.code().name}")
                continue
            parts = ", ".join(
                f"p{p.partition}@e{p.lease_epoch} pos {p.position} committed "
                f"{p.committed_offset} hw {p.high_watermark} buffered {p.buffered_records}"
                f"{' paused' if p.paused else ''} inflight {p.inflight} due {p.due}"
                for p in answer.partitions
            )
            try:
                text = metrics(sidecar)
            except OSError:
                text = ""
            gaps = {
                s.labels.get("partition"): round(s.value, 1)
                for s in samples_in(text, "ds_partition_not_fetching_current_seconds")
            }
            age = [round(s.value, 1) for s in samples_in(text, "ds_sidecar_last_poll_age_seconds")]
            brokers = {
                s.labels.get("broker"): s.value
                for s in samples_in(text, "ds_sidecar_broker_connected")
            }
            lines.append(
                f"{name} ({sidecar.grpc_addr}): {parts}; not fetching {gaps}; "
                f"last poll {age} s ago; brokers connected {brokers}"
            )
            if spy is not None:
                out = self.log_dir / f"{name}.py-spy.txt"
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    dump = subprocess.run(
                        [spy, "dump", "--pid", str(sidecar.pid)],
                        capture_output=True,
                        text=True,
                        timeout=30,
                        check=False,
                    )
                    out.write_text(dump.stdout + dump.stderr)
                    lines.append(f"{name}: threads in {out}")
        for loop in self.loops:
            bound = sorted(loop.client._binding.sidecars)
            lines.append(
                f"{loop.client.client_id}: bound to {bound}, {loop.batches} batches, "
                f"alive {loop.alive}, errors {loop.errors[:1]}"
            )
        return "\n  ".join(lines)

    def _scrape_redeliveries(self) -> dict[str, float]:
        """ds_sidecar_redeliveries_total by reason, summed over the sidecars still up."""
        by_reason: defaultdict[str, float] = defaultdict(float)
        for sidecar in self.sidecars:
            for sample in metric_samples(sidecar, "ds_sidecar_redeliveries_total"):
                by_reason[sample.labels.get("reason", "?")] += sample.value
        return dict(by_reason)

    def _deliveries(self, apps: list[AppLog]) -> Counter[tuple[int, int, int]]:
        """How often each Kafka record (seq, partition, offset) was delivered, to the
        tally's clients and the apps: a sequence the producer wrote twice is two records."""
        counts: Counter[tuple[int, int, int]] = Counter(
            (d.seq, d.partition, d.offset) for d in self.tally.deliveries
        )
        counts.update((d[0], d[1], d[2]) for app in apps for d in app.deliveries)
        return counts

    def _duplicates(self, apps: list[AppLog]) -> int:
        return sum(n - 1 for n in self._deliveries(apps).values() if n > 1)

    def _unexplained(self, apps: list[AppLog]) -> dict[int, list[Delivery]]:
        """Delivered again although an earlier delivery's ack was accepted: among the
        tally's clients, and for a record an app had, unless the app had it and did not
        ack it at the kill, or a client's ack of it was refused."""
        unexplained = unexplained_duplicates(self.tally)
        touched = {d[0] for app in apps for d in app.deliveries}
        at_fault = set().union(*(app.unacked | app.partly for app in apps))
        for (seq, partition, offset), n in self._deliveries(apps).items():
            if n < 2 or seq not in touched or seq in at_fault:
                continue
            elsewhere = [
                d
                for d in self.tally.by_seq.get(seq, [])
                if (d.partition, d.offset) == (partition, offset)
            ]
            if not any(not d.acked for d in elsewhere):
                unexplained[seq] = elsewhere
        return unexplained
