"""Consumer sidecar acceptance: what it guarantees where the old design failed.

* An infrequent caller (one fetch every 25 s, ``max.poll.interval.ms`` = 10 s) changes no
  lease and loses nothing — while a plain ``subscribe()`` consumer that only polls when the
  application calls (the old design, ARCHITECTURE §1.2), run at the same time on its own
  topic, is kicked out of its group.
* A zombie (SIGSTOP past its lease TTL + grace, then SIGCONT) delivers and commits nothing
  for the partitions that moved (§3, §3.1.4).
* After a kill -9, what is redelivered is exactly what was delivered and not acked (§3
  "Delivery").

Real Kafka, real assigner and sidecar processes; every record is counted.
"""

from __future__ import annotations

import math
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException

from dsclient import DsClient
from tests.support.assignment import (
    AssignmentWatcher,
    GroupView,
    describe,
    holders,
    wait_stable,
    wait_until,
)
from tests.support.loadrun import LoadRun
from tests.support.mesh import Mesh
from tests.support.producing import produce
from tests.support.records import SeqProducer, describe_missing, value_of
from tests.support.sidecar_probe import (
    CommitWatcher,
    committed,
    final_commits_not_the_survivors,
    kafka_config_file,
    status,
    zombie_commit_problems,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

TTL, GRACE = 3.0, 1.0  # the assigner's defaults

# ---- 1. infrequent caller ---------------------------------------------------------------

SLOW_PARTITIONS = 4
CALL_EVERY = 25.0
RUN_FOR = 180.0
TRICKLE_RATE = 5.0  # records/s per topic
# librdkafka requires max.poll.interval.ms >= session.timeout.ms (45 s by default).
RDKAFKA_GROUP = {"max.poll.interval.ms": "10000", "session.timeout.ms": "6000"}


class PollOnDemandConsumer:
    """The old design: a ``subscribe()`` consumer polled only when the application calls.
    Counts rebalance callbacks and the errors Kafka and librdkafka report."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.assigned = 0
        self.revoked = 0
        self.lost = 0
        self.errors: Counter[str] = Counter()
        self.events: list[str] = []
        self.received: list[tuple[int, int]] = []  # (partition, seq) in arrival order
        self.started = time.monotonic()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "error_cb": self._on_error,
                **RDKAFKA_GROUP,
            }
        )
        self.consumer.subscribe(
            [topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _event(self, what: str) -> None:
        self.events.append(f"+{time.monotonic() - self.started:.1f}s {what}")

    def _on_assign(self, _consumer: Consumer, partitions: list[object]) -> None:
        self.assigned += 1
        self._event(f"assigned {len(partitions)}")

    def _on_revoke(self, _consumer: Consumer, partitions: list[object]) -> None:
        self.revoked += 1
        self._event(f"revoked {len(partitions)}")

    def _on_lost(self, _consumer: Consumer, partitions: list[object]) -> None:
        self.lost += 1
        self._event(f"lost {len(partitions)}")

    def _on_error(self, error: KafkaError) -> None:
        self.errors[error.name()] += 1
        self._event(f"error {error.name()}")

    def call(self, timeout: float = 2.0) -> int:
        """One application call: poll once (like the old service), commit what came."""
        messages = self.consumer.consume(num_messages=10_000, timeout=timeout)
        good = 0
        for msg in messages:
            error = msg.error()
            if error is not None:
                self.errors[error.name()] += 1
                self._event(f"poll error {error.name()}")
                continue
            self.received.append((int(msg.partition() or 0), int(msg.key() or b"-1")))
            good += 1
        if good:
            try:
                self.consumer.commit(asynchronous=False)
            except KafkaException as exc:
                name = exc.args[0].name() if exc.args else "commit"
                self.errors[f"commit:{name}"] += 1
                self._event(f"commit failed {name}")
        return good

    @property
    def rebalances(self) -> int:
        """Partitions taken away (revoked or lost) — each one a group rebalance."""
        return self.revoked + self.lost

    def close(self) -> None:
        self.consumer.close()


def _order_problems(arrivals: list[tuple[int, int]]) -> list[str]:
    """Per partition, sequences must arrive increasing (they were produced in order)."""
    last: dict[int, int] = {}
    problems = []
    for partition, seq in arrivals:
        if seq <= last.get(partition, -1):
            problems.append(f"p{partition}: seq {seq} after {last[partition]}")
        last[partition] = seq
    return problems


@pytest.mark.long
def test_infrequent_caller_changes_no_lease_unlike_poll_on_demand(
    mesh: Mesh, topic_factory: object, tmp_path: Path
) -> None:
    ours_topic = topic_factory(partitions=SLOW_PARTITIONS)  # type: ignore[operator]
    base_topic = topic_factory(partitions=SLOW_PARTITIONS)  # type: ignore[operator]
    group = f"g-{ours_topic}"
    assigner = mesh.assigner([(group, [ours_topic])])
    assigner.wait_serving()
    config = kafka_config_file(tmp_path / "sidecar.yaml", RDKAFKA_GROUP)
    sidecar = mesh.sidecar(group, assigner, "slow-sc", "--config", config)
    sidecar.wait_serving()
    before = wait_stable(assigner.grpc_addr, group, ["slow-sc"], SLOW_PARTITIONS)
    effective = status(sidecar.grpc_addr).consumer_config
    for key, value in RDKAFKA_GROUP.items():
        assert effective.get(key) == value, f"sidecar runs with {key}={effective.get(key)}"
    epochs_before = {p.partition: p.lease_epoch for p in status(sidecar.grpc_addr).partitions}

    ours_producer = SeqProducer(mesh.bootstrap, ours_topic, SLOW_PARTITIONS, TRICKLE_RATE)
    base_producer = SeqProducer(mesh.bootstrap, base_topic, SLOW_PARTITIONS, TRICKLE_RATE)
    ours_producer.start()
    base_producer.start()
    watcher = AssignmentWatcher(assigner.grpc_addr, group, interval=0.5).start()
    baseline = PollOnDemandConsumer(mesh.bootstrap, base_topic, f"g-{base_topic}")
    calls = math.ceil(RUN_FOR / CALL_EVERY)
    started = time.monotonic()
    stop_baseline = threading.Event()
    baseline_failure: list[BaseException] = []

    def run_baseline() -> None:
        try:
            for i in range(calls):
                if stop_baseline.wait(max(0.0, started + i * CALL_EVERY - time.monotonic())):
                    return
                baseline.call()
        except BaseException as exc:  # reported by the main thread
            baseline_failure.append(exc)

    baseline_thread = threading.Thread(target=run_baseline, name="baseline-app", daemon=True)
    baseline_thread.start()

    ours: list[tuple[int, int]] = []  # (partition, seq) in arrival order
    epochs_seen: set[int] = set()
    errors: list[str] = []
    per_call: list[int] = []
    try:
        with DsClient(group, client_id="infrequent-app", assigner=assigner.grpc_addr) as client:
            for i in range(calls):
                time.sleep(max(0.0, started + i * CALL_EVERY - time.monotonic()))
                try:
                    batch = client.fetch(max_records=10_000, max_wait=2.0)
                    if batch and client.ack(batch) != len(batch):
                        errors.append(f"call {i}: not every ack accepted")
                except Exception as exc:  # the test's finding: reported, then asserted
                    errors.append(f"call {i}: {exc!r}")
                    continue
                per_call.append(len(batch))
                for r in batch:
                    ours.append((r.partition, int(r.key.decode())))
                    epochs_seen.add(r.lease_epoch)
                    assert r.value == value_of(int(r.key.decode()))
            ran_for = time.monotonic() - started
            produced = ours_producer.stop()
            base_produced = base_producer.stop()
            # Drain what was produced since the last call (the same pace no longer matters).
            deadline = time.monotonic() + 30
            while {s for _, s in ours} < produced and time.monotonic() < deadline:
                batch = client.fetch(max_records=10_000, max_wait=1.0)
                if batch:
                    client.ack(batch)
                ours.extend((r.partition, int(r.key.decode())) for r in batch)
    finally:
        stop_baseline.set()
        baseline_thread.join(timeout=30)
        watcher.stop()
    try:
        deadline = time.monotonic() + 30
        while {s for _, s in baseline.received} < base_produced and time.monotonic() < deadline:
            baseline.call(timeout=1.0)
    finally:
        baseline.close()

    after = describe(assigner.grpc_addr, group).leases
    epochs_after = {p.partition: p.lease_epoch for p in status(sidecar.grpc_addr).partitions}
    lease_changes = sum(len(h) - 1 for h in watcher.history.values()) + sum(
        1 for p in before if before[p] != after.get(p)
    )
    seqs = [s for _, s in ours]
    duplicates = [s for s, n in Counter(seqs).items() if n > 1]
    missing = produced - set(seqs)
    base_seqs = [s for _, s in baseline.received]
    base_missing = base_produced - set(base_seqs)
    base_dups = sum(n - 1 for n in Counter(base_seqs).values() if n > 1)
    print(
        f"ran {ran_for:.0f}s, {calls} calls every {CALL_EVERY:.0f}s with "
        f"max.poll.interval.ms={RDKAFKA_GROUP['max.poll.interval.ms']}, "
        f"session.timeout.ms={RDKAFKA_GROUP['session.timeout.ms']}"
    )
    print(
        f"sidecar: lease changes {lease_changes} (DescribeGroup polls {watcher.polls}, epochs "
        f"{sorted(epochs_seen)}), errors {len(errors)}, records per call {per_call}, "
        f"produced {len(produced)}, received {len(seqs)}, missing {len(missing)}, "
        f"duplicates {len(duplicates)}"
    )
    print(
        f"poll-on-demand baseline: rebalances {baseline.rebalances} (assign {baseline.assigned}, "
        f"revoke {baseline.revoked}, lost {baseline.lost}), errors {dict(baseline.errors)}, "
        f"produced {len(base_produced)}, received {len(base_seqs)}, missing "
        f"{len(base_missing)}, duplicates {base_dups}"
    )
    print("baseline events: " + "; ".join(baseline.events))
    assert not baseline_failure, f"the baseline application crashed: {baseline_failure!r}"
    assert not errors, errors
    assert lease_changes == 0, f"leases changed: {watcher.history}"
    assert holders(before) == holders(after)
    assert epochs_after == epochs_before, (epochs_before, epochs_after)
    assert not missing, describe_missing(missing, SLOW_PARTITIONS)
    assert not duplicates, f"{len(duplicates)} records delivered twice: {duplicates[:10]}"
    assert not _order_problems(ours), _order_problems(ours)[:10]
    assert baseline.rebalances >= 1, (
        "the poll-on-demand baseline was never kicked out of its group although it polled "
        f"every {CALL_EVERY:.0f}s with max.poll.interval.ms=10000: {baseline.events}"
    )


# ---- 2. zombie ----------------------------------------------------------------------------

ZOMBIE_PARTITIONS = 6
STOP_AT_LEAST = 8.0  # seconds: well past TTL + grace


class AckedRecordsRedelivered(AssertionError):
    """Records whose ack the sidecar accepted came again after it stopped (must not happen)."""


def test_sigstopped_zombie_delivers_and_commits_nothing_after_the_move(
    mesh: Mesh, topic_factory: object
) -> None:
    topic = topic_factory(partitions=ZOMBIE_PARTITIONS)  # type: ignore[operator]
    run = LoadRun(mesh, topic, ZOMBIE_PARTITIONS, ("zombie", "survivor"), rate=200)
    run.start()
    commits = CommitWatcher(mesh.bootstrap, run.group, topic, ZOMBIE_PARTITIONS, interval=0.1)
    try:
        commits.start()
        time.sleep(3)
        before = run.stable()
        zombie_parts = {p for p, v in before.items() if v.holder == "zombie"}
        zombie_addr = run.endpoint_of("zombie")
        run.sidecars["zombie"].signal(signal.SIGSTOP)
        stopped_at = time.monotonic()

        def moved_to_survivor(view: GroupView) -> bool:
            return all(
                view.leases[p].granted
                and view.leases[p].holder == "survivor"
                and view.leases[p].epoch > before[p].epoch
                for p in zombie_parts
            )

        moved_at, view = wait_until(run.addr, run.group, moved_to_survivor, timeout=30)
        time.sleep(max(0.0, stopped_at + STOP_AT_LEAST - time.monotonic()))
        run.sidecars["zombie"].signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        new_epochs = {p: view.leases[p].epoch for p in zombie_parts}
        time.sleep(8)  # the zombie's commit loop and any pending Fetch run again
        after = describe(run.addr, run.group)
    except BaseException:
        run.abort()
        commits.stop()
        raise
    result = run.finish()
    time.sleep(1.5)  # the survivor's last acks get committed
    commits.stop()
    final = committed(mesh.bootstrap, run.group, topic, ZOMBIE_PARTITIONS)

    # Commits: none by the zombie under its old epoch once the survivor committed or after
    # SIGCONT; never an epoch or an offset going backwards. (After SIGCONT the zombie rejoins
    # and may be granted partitions again, with new epochs: those commits are legitimate.)
    bad_commits = zombie_commit_problems(
        commits,
        ZOMBIE_PARTITIONS,
        {p: before[p].epoch for p in zombie_parts},
        stopped_at,
        resumed_at,
    )
    committed_at_stop = {
        p: max((c.offset for t, c in commits.changes(p) if t <= stopped_at), default=-1001)
        for p in range(ZOMBIE_PARTITIONS)
    }
    final_wrong = final_commits_not_the_survivors(final, new_epochs)

    # Deliveries: nothing from the zombie under its old epoch for a moved partition after
    # SIGCONT; the new owner
    # delivers each record once; a duplicate is a record the zombie delivered before the
    # stop at or above its last commit.
    late = [
        d
        for d in run.tally.deliveries
        if d.sidecar == zombie_addr
        and d.partition in zombie_parts
        and d.epoch == before[d.partition].epoch
        and d.fetched_at >= resumed_at
    ]
    acked_dups, unacked_dups, bad_dups = [], [], []
    for seq, ds in result.duplicates.items():
        first, rest = ds[0], ds[1:]
        if (
            first.sidecar != zombie_addr
            or first.partition not in zombie_parts
            # Received before SIGCONT means sent before the stop (a stopped process sends
            # nothing), even when the response landed after stopped_at.
            or first.fetched_at >= resumed_at
            or first.offset < committed_at_stop[first.partition]
            or len(rest) != 1
            or rest[0].sidecar == zombie_addr
        ):
            bad_dups.append(seq)
        elif first.acked and first.acked_at < stopped_at:
            acked_dups.append(seq)
        else:
            unacked_dups.append(seq)
    print(
        f"SIGSTOP zombie (held {sorted(zombie_parts)}): moved to survivor with new epochs "
        f"{new_epochs} after {moved_at - stopped_at:.2f}s; SIGCONT after "
        f"{resumed_at - stopped_at:.2f}s; holders after {holders(after.leases)}"
    )
    print(
        f"produced {len(result.produced)}, received {len(run.tally.received())}, deliveries "
        f"{len(run.tally.deliveries)}, duplicates {result.duplicate_count}: "
        f"{len(unacked_dups)} delivered-not-acked before the stop, {len(acked_dups)} acked "
        f"before the stop, {len(bad_dups)} unexplained; zombie deliveries after SIGCONT "
        f"{len(late)}; commit polls failed {commits.failed_polls}; bad commits {bad_commits}"
    )
    print(f"final commits of moved partitions: { {p: final[p].raw for p in zombie_parts} }")
    assert not result.errors, f"the application saw errors: {result.errors!r}"
    assert not result.missing, describe_missing(
        result.missing, ZOMBIE_PARTITIONS, producer=run.producer, tally=run.tally
    )
    assert zombie_parts, "the zombie held no partition"
    assert not bad_commits, bad_commits
    assert not final_wrong, f"last commits not by the new owner's epoch: {final_wrong}"
    assert not late, f"the zombie delivered {len(late)} records after SIGCONT: {late[:5]}"
    assert not bad_dups, {s: result.duplicates[s] for s in bad_dups[:5]}
    if acked_dups:
        raise AckedRecordsRedelivered(
            f"{len(acked_dups)} records acked before the SIGSTOP were delivered again, "
            f"e.g. {[result.duplicates[s] for s in acked_dups[:3]]}"
        )


# ---- 3. redelivery after kill -9 = exactly the un-acked set --------------------------------

REDELIVERY_PARTITIONS = 4
REDELIVERY_RECORDS = 2000
DELIVER_FIRST = 1200


class RedeliveryNotExact(AssertionError):
    """The redelivered set differs from the delivered-but-not-acked set."""


def test_kill9_redelivers_exactly_the_unacked_records(mesh: Mesh, topic_factory: object) -> None:
    topic = topic_factory(partitions=REDELIVERY_PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    produce(
        mesh.bootstrap,
        topic,
        range(REDELIVERY_RECORDS),
        partitions=REDELIVERY_PARTITIONS,
        value=value_of,
    )
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    first = mesh.sidecar(group, assigner, "first")
    first.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["first"], REDELIVERY_PARTITIONS)

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with DsClient(group, client_id="redelivery-app", assigner=assigner.grpc_addr) as client:
        delivered: dict[int, object] = {}
        deadline = time.monotonic() + 60
        while len(delivered) < DELIVER_FIRST and time.monotonic() < deadline:
            for r in client.fetch(max_records=200, max_wait=1.0):
                seq = int(r.key.decode())
                assert seq not in delivered, f"seq {seq} delivered twice before the kill"
                delivered[seq] = r
        assert len(delivered) >= DELIVER_FIRST, f"only {len(delivered)} delivered in 60 s"
        to_ack = rng.sample(sorted(delivered), k=len(delivered) // 2)  # random, unordered
        accepted = 0
        for i in range(0, len(to_ack), 50):
            accepted += client.ack([delivered[s] for s in to_ack[i : i + 50]])  # type: ignore[misc]
        assert accepted == len(to_ack), f"{accepted} of {len(to_ack)} acks accepted"
        first.kill()  # at once: no time for a periodic commit to save the acks
        killed_at = time.monotonic()
        at_kill = committed(mesh.bootstrap, group, topic, REDELIVERY_PARTITIONS)
        second = mesh.sidecar(group, assigner, "second")
        second.wait_serving()
        taken_at, _ = wait_until(
            assigner.grpc_addr,
            group,
            lambda v: all(x.granted and x.holder == "second" for x in v.leases.values()),
            timeout=60,
        )
        again: list[int] = []
        deadline = time.monotonic() + 60
        quiet_since = time.monotonic()
        # Everything: the records never delivered, and whatever comes again; then 3 s quiet.
        while time.monotonic() < deadline:
            batch = client.fetch(max_records=500, max_wait=0.5)
            if batch:
                assert client.ack(batch) == len(batch)
                again.extend(int(r.key.decode()) for r in batch)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 3 and len(set(again)) + len(delivered) >= (
                REDELIVERY_RECORDS
            ):
                break

    acked = set(to_ack)
    unacked = set(delivered) - acked
    redelivered = set(again) & set(delivered)
    never_delivered = set(range(REDELIVERY_RECORDS)) - set(delivered)
    lowest_hole: dict[int, int] = defaultdict(lambda: 1 << 62)
    for seq in unacked:
        r = delivered[seq]
        lowest_hole[r.partition] = min(lowest_hole[r.partition], r.offset)  # type: ignore[attr-defined]
    above_hole = {
        s
        for s in acked
        if delivered[s].offset >= lowest_hole[delivered[s].partition]  # type: ignore[attr-defined]
    }
    acked_again = redelivered & acked
    print(
        f"seed {seed}: delivered {len(delivered)} before kill -9, acked {len(acked)} at random, "
        f"un-acked {len(unacked)}; second sidecar held everything "
        f"{taken_at - killed_at:.2f}s after the kill"
    )
    print(
        f"committed at the kill: { {p: c.offset for p, c in sorted(at_kill.items())} }; "
        f"lowest un-acked offset per partition {dict(sorted(lowest_hole.items()))}"
    )
    print(
        f"redelivered {len(redelivered)}: un-acked {len(redelivered & unacked)}, acked "
        f"{len(acked_again)} ({len(acked_again & above_hole)} above the partition's lowest "
        f"un-acked offset, {len(acked_again - above_hole)} below it); acked records above "
        f"the lowest hole {len(above_hole)}; never-delivered received "
        f"{len(set(again) & never_delivered)}/{len(never_delivered)}"
    )
    assert not [s for s, n in Counter(again).items() if n > 1], "delivered twice after the kill"
    assert never_delivered <= set(again), describe_missing(
        never_delivered - set(again), REDELIVERY_PARTITIONS
    )
    assert unacked <= redelivered, f"{len(unacked - redelivered)} un-acked records lost"
    if redelivered != unacked:
        raise RedeliveryNotExact(
            f"{len(acked_again)} acked records redelivered "
            f"({len(acked_again - above_hole)} below the lowest un-acked offset, i.e. acked "
            f"and committable but not committed before the kill), e.g. "
            f"{sorted(acked_again)[:10]}"
        )
