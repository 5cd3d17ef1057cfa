"""An application that processes each batch before acking it, while the assigner is away
for longer than a lease TTL: no acked record is refused and delivered again.

The sidecars' leases expire locally while the assigner is away (fencing: nothing is
delivered or committed past the local deadline). A batch handed out just before the
deadline used to be acked just after it: the ack was refused and the records came again
(12 such duplicates failed tests/e2e/test_drain.py in CI). The sidecar now hands out
nothing within its delivery margin (``delivery_margin_seconds``, 0.5 s) of the deadline,
so a batch processed for less than the margin is acked and committed under its lease.
Red without the margin (``DS_DELIVERY_MARGIN_SECONDS=0`` in the environment).

Real Kafka, a real assigner and two sidecars, a producer at 300 records/s and a
``DsClient`` that spends 100 ms on each batch before acking it; the assigner is stopped
three times for a few seconds more than a TTL, then restarted.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from dsclient import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.assignment import GroupView, wait_until
from tests.support.mesh import running_mesh
from tests.support.ops import (
    unexplained_duplicates,
)
from tests.support.records import ConsumerLoop, SeqProducer, Tally
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 4
TTL = 3.0  # the assigner's default lease TTL
AWAY = TTL + 2.0  # long enough for every lease to expire locally
ROUNDS = 3
PROCESS_SECONDS = 0.1  # the application's work per batch, less than the margin
SIDECARS = ("sc-a", "sc-b")


def reattached(view: GroupView) -> bool:
    return (
        set(view.members) == set(SIDECARS)
        and len(view.leases) == PARTITIONS
        and all(lease.granted for lease in view.leases.values())
    )


def test_acks_of_batches_processed_while_the_assigner_is_away_are_not_refused(
    kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    topics = TopicFactory(kafka_cluster.bootstrap, "away")
    topic = topics(PARTITIONS)
    group = f"away-{uuid.uuid4().hex[:8]}"
    producer = SeqProducer(kafka_cluster.bootstrap, topic, PARTITIONS, rate=300.0).start()
    try:
        with running_mesh(kafka_cluster.bootstrap, tmp_path) as mesh:
            assigner = mesh.assigner([(group, [topic])])
            assigner.wait_serving(90)
            sidecars = [mesh.sidecar(group, assigner, sid) for sid in SIDECARS]
            for sidecar in sidecars:
                sidecar.wait_serving(90)
            with DsClient(group, client_id="away-app", assigner=assigner.grpc_addr) as client:
                tally = Tally()
                loop = ConsumerLoop(client, tally, process_seconds=PROCESS_SECONDS).start()
                wait_for(lambda: len(tally.received()) > 500, 90, "records flowing")
                for _ in range(ROUNDS):
                    assert assigner.stop() == 0
                    time.sleep(AWAY)
                    assigner.start()
                    assigner.wait_serving(90)
                    # Both sidecars re-attach with every lease granted, then delivery resumes.
                    wait_until(assigner.grpc_addr, group, reattached, timeout=90)
                    resumed_from = len(tally.received())
                    wait_for(
                        lambda n=resumed_from: len(tally.received()) > n, 90, "delivery resumed"
                    )
                time.sleep(2)
                confirmed = producer.confirmed()
                wait_for(lambda: not (confirmed - tally.received()), 90, "every record received")
                loop.stop()
                expired = sum(
                    sidecar.log.read_text().count("lease expired locally") for sidecar in sidecars
                )
    finally:
        producer.stop()
        topics.delete_all()

    duplicates = tally.duplicates()
    refused = sum(1 for ds in duplicates.values() if not ds[0].acked)
    print(
        f"assigner away {ROUNDS}x{AWAY:.0f}s, {PROCESS_SECONDS * 1000:.0f} ms per batch: "
        f"produced {len(confirmed)}, received {len(tally.received())}, lost "
        f"{len(confirmed - tally.received())}, duplicates {tally.duplicate_count()} "
        f"({refused} after a refused ack), unexplained {len(unexplained_duplicates(tally))}, "
        f"leases expired locally {expired}, batches {loop.batches} "
        f"(not fully acked {loop.partial_acks}), client errors {loop.errors}"
    )
    assert loop.errors == []
    assert expired >= ROUNDS, "the leases did expire while the assigner was away"
    assert not (confirmed - tally.received()), "records lost"
    assert unexplained_duplicates(tally) == {}
    assert loop.partial_acks == 0, "an ack was refused"
    assert tally.duplicate_count() == 0
