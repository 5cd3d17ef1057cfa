"""The smallest real version of the whole flow (issue: foundation).

An application fetches records through a sidecar that leased its partitions from the
assigner, on a real Kafka broker: every record arrives exactly once, in per-partition
order, and the group's committed offsets in Kafka end equal to the end offsets.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from dsclient import DsClient
from tests.support.mesh import Mesh
from tests.support.walking_skeleton import PARTITIONS, committed_offsets, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RECORDS = 10_000


def test_fetch_and_ack_every_record_exactly_once(mesh: Mesh, topic_factory: object) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    expected = produce(mesh.bootstrap, topic, RECORDS)

    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "sidecar-a")
    sidecar.wait_serving()

    received: dict[int, list[int]] = defaultdict(list)
    deadline = time.monotonic() + 120
    with DsClient(group, client_id="skeleton-app", assigner=assigner.grpc_addr) as client:
        total = 0
        while total < RECORDS and time.monotonic() < deadline:
            batch = client.fetch(max_records=500, max_wait=1.0)
            for record in batch:
                assert record.topic == topic
                assert record.lease_epoch >= 1
                received[record.partition].append(int(record.key.decode()))
                assert record.value == f"value-{int(record.key.decode())}".encode()
            total += len(batch)
            if batch:
                assert client.ack(batch) == len(batch)
        # Nothing more may arrive: a duplicate would show up here.
        extra = client.fetch(max_records=500, max_wait=1.5)
        assert extra == [], f"{len(extra)} records delivered twice"

    assert sum(len(v) for v in received.values()) == RECORDS
    assert dict(received) == dict(expected), "records missing, duplicated or out of order"

    ends = end_offsets(mesh.bootstrap, topic)
    deadline = time.monotonic() + 15
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        committed = committed_offsets(mesh.bootstrap, group, topic)
        if committed == ends:
            break
        time.sleep(0.5)
    assert committed == ends, f"committed {committed} != end offsets {ends}"
    assert sum(ends.values()) == RECORDS

    # A graceful stop of the sidecar releases its leases without losing the commits.
    assert sidecar.stop() == 0
    assert committed_offsets(mesh.bootstrap, group, topic) == ends
