"""``DsClient.ack_nowait`` on a real sidecar: pipelined acks keep every guarantee of ``ack``.

The application fetches, reads and acks each batch without waiting for the ack's answer
(the next fetch travels while the sidecar commits). Checked: every record arrives exactly
once, every future says the whole batch was accepted, ``close()`` waits for the acks still
on their way (so the group's committed offsets reach the end offsets without any further
call), and an ack after ``close()`` is refused with a clear error instead of being lost.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import pytest

from dsclient import ClientError, DsClient
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import PARTITIONS, assigner_of, start
from tests.support.walking_skeleton import committed_offsets, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_ack_nowait_pipelines_acks_and_close_drains_them(mesh: Mesh, topic_factory: Any) -> None:
    records = 6000
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(mesh.bootstrap, topic, records)
    group, _sidecar = start(mesh, topic)

    received: dict[int, list[int]] = defaultdict(list)
    acks: list[tuple[Future[int], int]] = []
    client = DsClient(group, client_id="nowait-app", assigner=assigner_of(mesh))
    deadline = time.monotonic() + 120
    try:
        while sum(map(len, received.values())) < records and time.monotonic() < deadline:
            batch = client.fetch(max_records=250, max_wait=1.0)
            for record in batch:
                received[record.partition].append(int(record.key.decode()))
            if batch:
                acks.append((client.ack_nowait(batch), len(batch)))
    finally:
        client.close()  # returns once every pending ack has its answer

    assert all(future.done() for future, _ in acks), "close() returned before its acks"
    assert [future.result() for future, _ in acks] == [n for _, n in acks]
    assert dict(received) == dict(expected), "records missing, duplicated or out of order"
    # close() drained the acks, and each ack is committed before it is answered.
    assert committed_offsets(mesh.bootstrap, group, topic) == end_offsets(mesh.bootstrap, topic)

    with pytest.raises(ClientError, match="closed"):
        client.ack_nowait(batch)
