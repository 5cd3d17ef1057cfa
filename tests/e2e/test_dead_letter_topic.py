"""The group's dead-letter topic (issue 39): a record a client always fails is produced to
the dead-letter topic, with headers naming its origin, before the group commits past it;
nothing is lost.

Real Kafka, real assigner and sidecar processes, a real DsClient; every record is counted:
produced = acked + dead-lettered, and the committed offsets reach the end of the log.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from dsclient import DsClient
from tests.support import accounting
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets
from tests.support.records import value_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 2
RECORDS = 200
MAX_DELIVERIES = 3
# The records the client always nacks: (partition, offset).
POISON = {(0, 7), (1, 40), (1, 41)}
CLIENT = "always-fails-x"


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """RECORDS keyed records, round robin over the partitions; (partition, offset) -> seq."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    where: dict[tuple[int, int], int] = {}

    def report(err: object, msg: object) -> None:
        assert err is None, err
        where[(msg.partition(), msg.offset())] = int(msg.key())  # type: ignore[attr-defined]

    for seq in range(RECORDS):
        producer.produce(
            topic,
            key=str(seq).encode(),
            value=value_of(seq),
            partition=seq % PARTITIONS,
            headers=[("origin-trace", f"t{seq}".encode())],
            on_delivery=report,
        )
    assert producer.flush(30) == 0
    assert len(where) == RECORDS
    return where


def read_all(bootstrap: str, topic: str, quiet: float = 3.0) -> list[object]:
    """Every record of ``topic`` (from the beginning, until ``quiet`` s bring nothing)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    out: list[object] = []
    try:
        consumer.subscribe([topic])
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                out.append(msg)
                last = time.monotonic()
    finally:
        consumer.close()
    return out


def test_a_record_a_client_always_fails_goes_to_the_dead_letter_topic_and_nothing_is_lost(
    mesh: Mesh, topic_factory: object
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    dlq = f"{group}.dlq"
    where = produce(mesh.bootstrap, topic)
    poison_seqs = {where[p] for p in POISON}
    assigner = mesh.assigner([(group, [topic])], settings={"max_deliveries": str(MAX_DELIVERIES)})
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "sc-1", env={"DS_DEAD_LETTER_TOPIC": "{group}.dlq"})
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["sc-1"], PARTITIONS)

    acked: set[int] = set()
    nacks: dict[int, int] = dict.fromkeys(poison_seqs, 0)
    ends = {p: sum(1 for (q, _) in where if q == p) for p in range(PARTITIONS)}
    try:
        with DsClient(group, client_id=CLIENT, assigner=assigner.grpc_addr) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                batch = client.fetch(max_records=100, max_wait=0.5)
                bad = [r for r in batch if (r.partition, r.offset) in POISON]
                good = [r for r in batch if (r.partition, r.offset) not in POISON]
                if good:
                    assert client.ack(good) == len(good)
                    acked.update(int(r.key) for r in good)
                if bad:
                    client.nack(bad)
                    for r in bad:
                        nacks[int(r.key)] += 1
                if (
                    len(acked) == RECORDS - len(POISON)
                    and committed_offsets(mesh.bootstrap, group, topic, PARTITIONS) == ends
                ):
                    break
        committed = committed_offsets(mesh.bootstrap, group, topic, PARTITIONS)
        dead = read_all(mesh.bootstrap, dlq)
    finally:
        AdminClient({"bootstrap.servers": mesh.bootstrap}).delete_topics([dlq])

    origins = {}
    for msg in dead:
        headers = dict(msg.headers())  # type: ignore[attr-defined]
        origin = (int(headers["ds-dlq-partition"]), int(headers["ds-dlq-offset"]))
        origins[origin] = msg
        seq = where[origin]
        assert headers["ds-dlq-topic"] == topic.encode()
        assert headers["ds-dlq-group"] == group.encode()
        assert headers["ds-dlq-client"] == CLIENT.encode()
        assert headers["ds-dlq-last-error"] == b"nack"
        assert headers["ds-dlq-deliveries"] == str(MAX_DELIVERIES).encode()
        assert headers["origin-trace"] == f"t{seq}".encode(), "the record's own headers kept"
        assert msg.key() == str(seq).encode() and msg.value() == value_of(seq)  # type: ignore[attr-defined]
    dead_seqs = {where[o] for o in origins}
    lost = set(range(RECORDS)) - acked - dead_seqs
    accounting.report(
        f"dead letter: produced {RECORDS}, acked {len(acked)}, dead-lettered {len(dead_seqs)} "
        f"({len(dead)} on the topic), lost {len(lost)}, nacks per poison record "
        f"{sorted(nacks.values())}, committed {committed} of {ends}"
    )
    assert set(origins) == POISON, f"dead-lettered {sorted(origins)}, expected {sorted(POISON)}"
    assert len(dead) == len(POISON), "each poison record once (no crash, no lease move here)"
    assert not acked & dead_seqs
    assert len(acked) + len(dead_seqs) == RECORDS and not lost, f"lost {sorted(lost)}"
    assert all(n == MAX_DELIVERIES for n in nacks.values()), nacks
    assert committed == ends, "the commit passed the dead-lettered records"
