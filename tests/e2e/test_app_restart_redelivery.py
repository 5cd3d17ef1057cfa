"""Nothing stays in flight forever (ARCHITECTURE §3 "Delivery"): records a client received
and did not ack are delivered again — when its stream or binding ends, when it nacks them,
or when the group's visibility timeout passes — to whichever client reads next.

Real Kafka, real assigner and sidecar processes, real DsClients; every record is counted.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from subprocess import STDOUT, Popen

import pytest
from confluent_kafka import Producer

from services.client import DsClient
from tests.e2e.test_notifier_support import metric_value, metrics
from tests.support.app_process import AppLog
from tests.support.assignment import wait_stable
from tests.support.mesh import REPO, Mesh
from tests.support.records import (
    ConsumerLoop,
    SeqProducer,
    Tally,
    describe_missing,
    partition_gaps,
    value_of,
    wait_received,
)
from tests.support.sidecar_probe import CommitWatcher, status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 3
RECORDS = 900
VISIBILITY = 30.0  # the default visibility timeout


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for seq in range(count):
        producer.produce(
            topic, key=str(seq).encode(), value=value_of(seq), partition=seq % partitions
        )
    assert producer.flush(30) == 0


def test_records_a_client_read_and_closed_without_acking_reach_the_next_client(
    mesh: Mesh, topic_factory: object
) -> None:
    """What a new user tried: a client reads records, acks none of them and closes; the
    next client of the group must receive every one of them, within the visibility
    timeout at most (at once, since the closing client's binding ended)."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    produce(mesh.bootstrap, topic, RECORDS, PARTITIONS)
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "sc-1")
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["sc-1"], PARTITIONS)

    unacked: set[int] = set()
    with DsClient(group, client_id="reader-1", assigner=assigner.grpc_addr) as first:
        deadline = time.monotonic() + 30
        while len(unacked) < RECORDS * 2 // 3 and time.monotonic() < deadline:
            unacked.update(int(r.key) for r in first.fetch(max_records=200, max_wait=1.0))
    closed_at = time.monotonic()
    assert len(unacked) >= RECORDS * 2 // 3, f"only {len(unacked)} read in 30 s"

    again: dict[int, float] = {}
    with DsClient(group, client_id="reader-2", assigner=assigner.grpc_addr) as second:
        deadline = closed_at + VISIBILITY + 10
        while not unacked <= set(again) and time.monotonic() < deadline:
            batch = second.fetch(max_records=500, max_wait=0.5)
            if batch:
                assert second.ack(batch) == len(batch)
                for r in batch:
                    again.setdefault(int(r.key), time.monotonic() - closed_at)
    missing = unacked - set(again)
    came_back = [again[s] for s in unacked if s in again]
    print(
        f"read and not acked {len(unacked)}; delivered again to the next client "
        f"{len(unacked) - len(missing)} (the last {max(came_back, default=0):.1f}s after the "
        f"first closed); never delivered again {len(missing)}"
    )
    assert not missing, (
        f"{len(missing)} un-acked records never came again, e.g. {sorted(missing)[:10]}"
    )
    assert max(came_back) <= VISIBILITY


# ---- chaos scenario 5: an application container restart ---------------------------------

SCENARIO_PARTITIONS = 6
SCENARIO_VISIBILITY = 10.0  # the group's visibility_timeout (the assigner's YAML)
ACK_FOR = 6.0  # the application acks this long, then holds what it reads until killed
HOLD_FOR = 4.0


def start_app(mesh: Mesh, group: str, assigner: str, out: Path, *, stream: bool) -> Popen[bytes]:
    """The application container: a real process, killed with SIGKILL by the test."""
    argv = [
        sys.executable, "-m", "tests.support.app_process", "--group", group,
        "--assigner", assigner, "--client-id", "app-1", "--out", str(out),
        "--ack-for", str(ACK_FOR), *(["--stream"] if stream else []),
    ]  # fmt: skip
    log = (mesh.log_dir / "app-1.log").open("ab")
    return Popen(argv, cwd=REPO, stdout=log, stderr=STDOUT, start_new_session=True)


@pytest.mark.parametrize("stream", [False, True], ids=["fetch", "stream"])
def test_an_application_restart_gets_every_unacked_record_again_within_the_visibility_timeout(
    mesh: Mesh, topic_factory: object, tmp_path: Path, stream: bool
) -> None:
    """Chaos scenario 5 (issue 17). A producer writes throughout; three sidecars; two
    clients read and ack all along. The application (a real process, client id app-1)
    acks for a while, then holds what it reads, and is killed with SIGKILL; a new client
    with the same id binds. Every record the killed application had and did not ack is
    delivered again within the group's visibility timeout (at once with the Stream RPC,
    whose end gives them back); then every produced record is accounted for."""
    topic = topic_factory(partitions=SCENARIO_PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    config = tmp_path / "assigner.yaml"
    config.write_text(
        f"groups:\n  - name: {group}\n    topics: [{topic}]\n"
        f"    visibility_timeout_seconds: {SCENARIO_VISIBILITY}\n"
    )
    assigner = mesh.service("assigner", "--config", str(config))
    assigner.wait_serving()
    ids = ["sc-1", "sc-2", "sc-3"]
    sidecars = [mesh.sidecar(group, assigner, sid, "--log-level", "debug") for sid in ids]
    for svc in sidecars:
        svc.wait_serving()
    wait_stable(assigner.grpc_addr, group, ids, SCENARIO_PARTITIONS)
    assert status(sidecars[0].grpc_addr).visibility_timeout.ToSeconds() == SCENARIO_VISIBILITY

    started = time.monotonic()
    producer = SeqProducer(mesh.bootstrap, topic, SCENARIO_PARTITIONS, rate=200).start()
    commits = CommitWatcher(mesh.bootstrap, group, topic, SCENARIO_PARTITIONS).start()
    tally = Tally()
    clients = [
        DsClient(group, client_id=f"steady-{i}", assigner=assigner.grpc_addr) for i in (1, 2)
    ]
    loops = [ConsumerLoop(c, tally, max_records=100).start() for c in clients]
    out = tmp_path / "app-1.out"
    app = start_app(mesh, group, assigner.grpc_addr, out, stream=stream)
    new_client: DsClient | None = None
    try:
        time.sleep(ACK_FOR + HOLD_FOR)
        deadline = time.monotonic() + 30
        while not AppLog.read(out).unacked and time.monotonic() < deadline:
            # Under CPU load one ack (a Kafka commit before its answer) can take seconds:
            # kill only once the application holds records it did not ack.
            time.sleep(0.2)
        killed_at = time.monotonic()  # before: a Stream's records come again within ms
        os.killpg(app.pid, signal.SIGKILL)
        app.wait(10)
        killed = AppLog.read(out)
        assert killed.acked and killed.unacked, "the application acked, then held records"
        new_client = DsClient(group, client_id="app-1", assigner=assigner.grpc_addr)
        loops.append(ConsumerLoop(new_client, tally, max_records=100).start())
        missing = wait_received(tally, killed.unacked, SCENARIO_VISIBILITY + 10)
        time.sleep(2)
        produced = producer.stop()
        done = killed.acked | killed.partly
        still = wait_received(tally, produced - done, 60)
        ended = time.monotonic()
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
        for loop in loops:
            loop.stop()
        for client in [*clients, *([new_client] if new_client else [])]:
            client.close()
        commits.stop()

    live = tally.received()
    lost = produced - live - done
    again: dict[int, tuple[float, str]] = {}  # seq -> (seconds after the kill, client)
    with tally.lock:
        for d in sorted(tally.deliveries, key=lambda d: d.fetched_at):
            if d.seq in killed.unacked and d.fetched_at >= killed_at:
                again.setdefault(d.seq, (d.fetched_at - killed_at, d.client))
    to_new = sum(1 for _, client in again.values() if client == "app-1")
    deliveries: Counter[int] = Counter(d[0] for d in killed.deliveries)
    deliveries.update(d.seq for d in tally.deliveries)
    duplicates = {s: n - 1 for s, n in deliveries.items() if n > 1}
    at_fault = {s for s in duplicates if s in killed.unacked or s in killed.partly}
    refused = {
        s for s in duplicates if s not in at_fault and any(not d.acked for d in tally.by_seq[s])
    }
    unexplained = set(duplicates) - at_fault - refused
    backwards = [
        (p, a.offset, b.offset)
        for p in range(SCENARIO_PARTITIONS)
        for (_, a), (_, b) in itertools.pairwise(commits.changes(p))
        if a.offset >= 0 and b.offset < a.offset
    ]
    skipped = sum(
        metric_value(metrics(s), "ds_sidecar_records_given_up_total", group=group) or 0
        for s in sidecars
    )
    gaps = partition_gaps(tally, started, ended)
    slowest = max((t for t, _ in again.values()), default=0.0)
    print(
        f"chaos app restart ({'stream' if stream else 'fetch'}): produced {len(produced)}, "
        f"received {len(produced) - len(lost)}, lost {len(lost)}, skipped {skipped:.0f}, "
        f"duplicates {sum(duplicates.values())} ({len(at_fault)} delivered to the killed "
        f"application and not acked, {len(refused)} after a refused ack), unexplained "
        f"{len(unexplained)}; un-acked at the kill {len(killed.unacked)} (and "
        f"{len(killed.partly)} whose ack was unanswered or partly accepted), delivered again "
        f"{len(again)} within {slowest:.1f}s of the kill (visibility {SCENARIO_VISIBILITY:.0f}s; "
        f"{to_new} to the new app-1, {len(again) - to_new} to the other clients); max time "
        f"with no consumption per partition "
        f"{max(gaps.values(), default=0):.1f}s; committed offsets backwards {len(backwards)}"
    )
    assert not missing, f"{len(missing)} un-acked records never came again: {sorted(missing)[:10]}"
    assert slowest <= SCENARIO_VISIBILITY + 1.0
    assert not lost and not still, describe_missing(lost | still, SCENARIO_PARTITIONS)
    assert not unexplained, f"unexplained duplicates: {sorted(unexplained)[:10]}"
    assert not backwards, backwards
    assert skipped == 0
    assert not [e for loop in loops for e in loop.errors]
