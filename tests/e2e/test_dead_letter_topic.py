"""The group's dead-letter topic (issue 39): a record a client always fails is produced to
the dead-letter topic, with headers naming its origin, before the group commits past it;
nothing is lost.

Real Kafka, real assigner and sidecar processes, a real DsClient; every record is counted:
produced = acked + dead-lettered, and the committed offsets reach the end of the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from dsclient import DsClient
from tests.support import accounting, cli, producing
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets
from tests.support.ops import (
    metric_samples,
)
from tests.support.records import value_of
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 2
RECORDS = 200
MAX_DELIVERIES = 3
# The records the client always nacks: (partition, offset).
POISON = {(0, 7), (1, 40), (1, 41)}
CLIENT = "always-fails-x"


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], int]:
    """RECORDS keyed records, round robin over the partitions; (partition, offset) -> seq."""
    where: dict[tuple[int, int], int] = {}

    def report(seq: int, msg: Message) -> None:
        where[(msg.partition(), msg.offset())] = seq  # type: ignore[index]

    producing.produce(
        bootstrap,
        topic,
        range(RECORDS),
        partitions=PARTITIONS,
        value=value_of,
        headers=lambda seq: [("origin-trace", f"t{seq}".encode())],
        delivered=report,
    )
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


@pytest.fixture
def own_state(mesh: Mesh) -> Iterator[dict[str, str]]:
    """An assigner environment with a state topic and transactional id of this test's own:
    other tests' assigners on the same Kafka (without Consul) would fence the shared one."""
    unique = uuid.uuid4().hex[:8]
    state_topic = f"__ds_assigner_state.test-{unique}"
    yield {"DS_STATE_TOPIC": state_topic, "DS_STATE_TRANSACTIONAL_ID": f"ds-state-{unique}"}
    admin = AdminClient({"bootstrap.servers": mesh.bootstrap})
    for future in admin.delete_topics([state_topic]).values():
        future.exception(timeout=30)  # gone, or never created: either is fine


def dsctl(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_BOOTSTRAP": bootstrap, "DS_DEAD_LETTER_TOPIC": "{group}.dlq"}
    return cli.dsctl("dlq", *args, env=env, timeout=120)


def test_a_record_a_client_always_fails_goes_to_the_dead_letter_topic_and_nothing_is_lost(
    mesh: Mesh, topic_factory: object, own_state: dict[str, str]
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    dlq = f"{group}.dlq"
    where = produce(mesh.bootstrap, topic)
    poison_seqs = {where[p] for p in POISON}
    # The group's own config names its dead-letter topic (the sidecar has none).
    assigner = mesh.assigner(
        [(group, [topic])],
        settings={"max_deliveries": str(MAX_DELIVERIES), "dead_letter_topic": dlq},
        env=own_state,
    )
    assigner.wait_serving()
    sidecar = mesh.sidecar(
        group, assigner, "sc-1", env={"DS_DEAD_LETTER_CHECK_INTERVAL_SECONDS": "1"}
    )
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
        depth = wait_for(
            lambda: [s.value for s in metric_samples(sidecar, "ds_sidecar_dead_letter_records")
                     if s.value == len(POISON)],
            30, "the dead-letter depth metric",
        )  # fmt: skip
        age = metric_samples(sidecar, "ds_sidecar_dead_letter_oldest_age_seconds")
        counted = metric_samples(sidecar, "ds_sidecar_records_dead_lettered_total")
        replayed = replay_to_a_fixed_client(mesh, assigner.grpc_addr, group, topic, where)
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
    assert depth == [len(POISON)]
    assert [s.value > 0 for s in age] == [True], age
    assert [s.value for s in counted] == [len(POISON)], counted
    assert replayed == {where[(0, 7)]}, "dsctl dlq replay delivered X again to a fixed client"


def replay_to_a_fixed_client(
    mesh: Mesh, assigner: str, group: str, topic: str, where: dict[tuple[int, int], int]
) -> set[int]:
    """dsctl dlq list/show see the dead-lettered records; replay of the one from (0, 7)
    sends it back through the mesh, where a client that no longer fails receives and
    acks it; purge empties the dead-letter partition. The seqs the fixed client got."""
    listed = dsctl(mesh.bootstrap, "list", group, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["depth"] == len(POISON), doc
    assert all(row["oldest_age_seconds"] is not None for row in doc["partitions"] if row["depth"])
    shown = dsctl(mesh.bootstrap, "show", group, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    origins = {
        (int(d["origin"]["partition"]), int(d["origin"]["offset"]))
        for d in map(json.loads, shown.stdout.splitlines())
    }
    assert origins == POISON, origins
    x = str(where[(0, 7)])
    replay = dsctl(mesh.bootstrap, "replay", group, "--origin-offset", "7", "--key", x)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["replayed"] == 1, replay.stdout
    got: set[int] = set()
    with DsClient(group, client_id="fixed", assigner=assigner) as fixed:
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            batch = fixed.fetch(max_records=100, max_wait=0.5)
            if batch:
                assert fixed.ack(batch) == len(batch)
                got.update(int(r.key) for r in batch)
    purged = dsctl(mesh.bootstrap, "purge", group, "--partition", "0", "--to-offset", "-1", "--yes")
    assert purged.returncode == 0, purged.stderr
    after = json.loads(dsctl(mesh.bootstrap, "list", group, "-o", "json").stdout)
    assert after["depth"] == 0, after
    return got


CRASH_RECORDS = 60
CRASH_X = 10  # the offset the client always fails (one partition)
SET = AlterConfigOpType.SET


def test_a_parked_record_survives_a_dead_letter_outage_and_a_sidecar_kill(
    mesh: Mesh, topic_factory: object, own_state: dict[str, str]
) -> None:
    """The dead-letter topic refuses every record (max.message.bytes 16): X stays parked,
    the commit point stays at X, and after kill -9 of the sidecar, the topic fixed, a new
    sidecar delivers X again and dead-letters it: X on the topic once, 0 lost."""
    topic = topic_factory(partitions=1)  # type: ignore[operator]
    dlq = topic_factory(partitions=1, config={"max.message.bytes": "16"})  # type: ignore[operator]
    group = f"g-{topic}"
    producer = Producer({"bootstrap.servers": mesh.bootstrap, "enable.idempotence": True})
    for seq in range(CRASH_RECORDS):
        producer.produce(topic, key=str(seq).encode(), value=value_of(seq), partition=0)
    assert producer.flush(30) == 0
    assigner = mesh.assigner(
        [(group, [topic])], settings={"max_deliveries": str(MAX_DELIVERIES)}, env=own_state
    )
    assigner.wait_serving()
    env = {"DS_DEAD_LETTER_TOPIC": dlq, "DS_DEAD_LETTER_CHECK_INTERVAL_SECONDS": "1"}
    first = mesh.sidecar(group, assigner, "sc-1", env=env)
    first.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["sc-1"], 1)

    acked: set[int] = set()
    nacks = 0

    def serve(client: DsClient, done: Callable[[], bool], seconds: float) -> None:
        nonlocal nacks
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            batch = client.fetch(max_records=100, max_wait=0.5)
            good = [r for r in batch if r.offset != CRASH_X]
            if good:
                assert client.ack(good) == len(good)
                acked.update(int(r.key) for r in good)
            if len(good) < len(batch):
                client.nack([r for r in batch if r.offset == CRASH_X])
                nacks += 1

    def given_up(svc: object) -> float:
        return sum(s.value for s in metric_samples(svc, "ds_sidecar_records_given_up_total"))  # type: ignore[arg-type]

    with DsClient(group, client_id=CLIENT, assigner=assigner.grpc_addr) as client:
        serve(client, lambda: given_up(first) >= 1 and len(acked) == CRASH_RECORDS - 1, 90)
        assert given_up(first) == 1, "X given up by the first sidecar"
        time.sleep(3)  # a few refused produces and commit rounds: the point must stay at X
        during_outage = committed_offsets(mesh.bootstrap, group, topic, 1)[0]
        dead_lettered = metric_samples(first, "ds_sidecar_records_dead_lettered_total")
        first.kill()
        admin = AdminClient({"bootstrap.servers": mesh.bootstrap})  # kept until answered
        fixed = ConfigResource(
            ConfigResource.Type.TOPIC,
            dlq,
            incremental_configs=[
                ConfigEntry("max.message.bytes", "1048588", incremental_operation=SET)
            ],
        )
        admin.incremental_alter_configs([fixed])[fixed].result(timeout=30)
        second = mesh.sidecar(group, assigner, "sc-2", env=env)
        second.wait_serving()
        serve(
            client,
            lambda: committed_offsets(mesh.bootstrap, group, topic, 1)[0] == CRASH_RECORDS,
            120,
        )
    committed = committed_offsets(mesh.bootstrap, group, topic, 1)[0]
    dead = read_all(mesh.bootstrap, dlq)
    dead_offsets = [int(dict(m.headers())["ds-dlq-offset"]) for m in dead]  # type: ignore[attr-defined]
    lost = set(range(CRASH_RECORDS)) - acked - {CRASH_X}
    accounting.report(
        f"dead letter, outage + kill -9: produced {CRASH_RECORDS}, acked {len(acked)}, "
        f"dead-lettered {dead_offsets}, lost {len(lost)}, nacks {nacks}, committed during the "
        f"outage {during_outage}, at the end {committed}"
    )
    assert [s.value for s in dead_lettered] == [0], "nothing reached the refusing topic"
    assert during_outage == CRASH_X, "the commit point stayed at the parked record"
    assert dead_offsets == [CRASH_X], "X on the dead-letter topic exactly once"
    assert CRASH_X not in acked and not lost, f"lost {sorted(lost)}"
    assert len(acked) + len(dead_offsets) == CRASH_RECORDS
    assert committed == CRASH_RECORDS
