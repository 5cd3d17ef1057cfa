"""Compatibility mode (ARCHITECTURE §5.6; issue "Consumer sidecar", item 6).

The same application — fetch and ack every record through ``DsClient`` — works against a
group in ``leased`` mode and in ``kafka_group`` mode (classic subscribe(), cooperative-sticky,
static membership): every record exactly once, in per-partition order, and the group's
committed offsets end equal to the end offsets. Switching a group's mode (stop every
sidecar, change the mode, start them) keeps its committed offsets.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from dsclient import DsClient
from tests.support import offsets
from tests.support.group_modes import (
    GroupSpec,
    describe_kafka_group,
    set_group_mode_in_state,
    start_assigner,
    wait_kafka_group_empty,
    wait_kafka_group_stable,
)
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.producing import produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 8
RECORDS = 4000
SIDECARS = ("sidecar-a", "sidecar-b")
# Static members of stopped kafka_group sidecars leave the Kafka group after this.
GROUP_CONFIG = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}

Received = dict[int, list[int]]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return offsets.end_offsets(bootstrap, topic, PARTITIONS)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return offsets.committed_offsets(bootstrap, group, topic, PARTITIONS)


def start_sidecars(
    mesh: Mesh, group: str, assigner: ServiceProcess, mode: str
) -> list[ServiceProcess]:
    sidecars = [mesh.sidecar(group, assigner, sid) for sid in SIDECARS]
    for sidecar in sidecars:
        sidecar.wait_serving()
    if mode == "kafka_group":
        # Read once both have joined: a read during the second join's rebalance gets
        # refused acks and records again (at least once), which this test does not count.
        wait_kafka_group_stable(mesh.bootstrap, group, len(SIDECARS))
    return sidecars


def consume(
    assigner: ServiceProcess, group: str, mode: str, received: Received, until: int
) -> None:
    """Fetch and ack through the client library until ``until`` records arrived overall;
    at ``until`` == everything, also check that nothing more arrives."""
    deadline = time.monotonic() + 120
    total = sum(len(v) for v in received.values())
    with DsClient(group, client_id=f"app-{mode}", assigner=assigner.grpc_addr) as client:
        while total < until and time.monotonic() < deadline:
            batch = client.fetch(max_records=200, max_wait=1.0)
            for record in batch:
                seq = int(record.key.decode())
                assert record.value == f"value-{seq}".encode()
                if mode == "kafka_group":
                    assert record.lease_epoch == 0, "kafka_group records carry no lease"
                else:
                    assert record.lease_epoch >= 1
                received[record.partition].append(seq)
            total += len(batch)
            if batch:
                assert client.ack(batch) == len(batch)
        if until >= RECORDS:
            extra = client.fetch(max_records=500, max_wait=2.0)
            assert extra == [], f"{len(extra)} records delivered twice"
    assert total >= until, f"only {total} of {until} records arrived"


def wait_committed(bootstrap: str, group: str, topic: str, expected: dict[int, int]) -> None:
    deadline = time.monotonic() + 20
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        committed = committed_offsets(bootstrap, group, topic)
        if committed == expected:
            return
        time.sleep(0.5)
    assert committed == expected, f"committed {committed} != {expected}"


def check_kafka_group(bootstrap: str, group: str, mode: str) -> None:
    description = describe_kafka_group(bootstrap, group)
    if mode == "kafka_group":
        assert sorted(m.group_instance_id or "" for m in description.members) == list(SIDECARS)
        assert description.partition_assignor == "cooperative-sticky"
    else:
        assert description.members == [], "a leased group must have no Kafka members"


@pytest.mark.parametrize("mode", ["leased", "kafka_group"])
def test_same_application_in_either_mode(mesh: Mesh, topic_factory: object, mode: str) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    expected = produce(
        mesh.bootstrap,
        topic,
        range(RECORDS),
        partitions=PARTITIONS,
        value=lambda seq: f"value-{seq}".encode(),
    )
    assigner = start_assigner(mesh, [GroupSpec(group, [topic], mode, GROUP_CONFIG)])
    assigner.wait_serving()
    sidecars = start_sidecars(mesh, group, assigner, mode)

    received: Received = defaultdict(list)
    consume(assigner, group, mode, received, RECORDS)

    assert dict(received) == dict(expected), "records missing, duplicated or out of order"
    ends = end_offsets(mesh.bootstrap, topic)
    wait_committed(mesh.bootstrap, group, topic, ends)
    check_kafka_group(mesh.bootstrap, group, mode)
    for sidecar in sidecars:
        assert sidecar.stop() == 0
    assert committed_offsets(mesh.bootstrap, group, topic) == ends


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("leased", "kafka_group"),
        # The way back is also in test_mode_switch.py (with a client reading): long profile.
        pytest.param("kafka_group", "leased", marks=pytest.mark.long),
    ],
)
def test_switching_modes_keeps_committed_offsets(
    mesh: Mesh, topic_factory: object, first: str, second: str
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    expected = produce(
        mesh.bootstrap,
        topic,
        range(RECORDS),
        partitions=PARTITIONS,
        value=lambda seq: f"value-{seq}".encode(),
    )
    received: Received = defaultdict(list)

    # Half in the first mode; a graceful stop commits what was acked.
    assigner = start_assigner(mesh, [GroupSpec(group, [topic], first, GROUP_CONFIG)])
    assigner.wait_serving()
    sidecars = start_sidecars(mesh, group, assigner, first)
    consume(assigner, group, first, received, RECORDS // 2)
    for sidecar in sidecars:
        assert sidecar.stop() == 0
    consumed = sum(len(v) for v in received.values())
    committed = committed_offsets(mesh.bootstrap, group, topic)
    assert sum(max(o, 0) for o in committed.values()) == consumed, "acked != committed"

    # The procedure: every sidecar stopped (and, after kafka_group, its static members
    # gone from the Kafka group), change the mode, start again.
    if first == "kafka_group":
        wait_kafka_group_empty(mesh.bootstrap, group)
    assert assigner.stop() == 0
    set_group_mode_in_state(mesh.bootstrap, group, second)
    assigner = start_assigner(mesh, [GroupSpec(group, [topic], second, GROUP_CONFIG)])
    assigner.wait_serving()
    start_sidecars(mesh, group, assigner, second)
    consume(assigner, group, second, received, RECORDS)

    assert dict(received) == dict(expected), "records missing, duplicated or out of order"
    ends = end_offsets(mesh.bootstrap, topic)
    wait_committed(mesh.bootstrap, group, topic, ends)
    check_kafka_group(mesh.bootstrap, group, second)
