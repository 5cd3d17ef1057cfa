"""Nothing stays in flight forever (ARCHITECTURE §3 "Delivery"): records a client received
and did not ack are delivered again — when its stream or binding ends, when it nacks them,
or when the group's visibility timeout passes — to whichever client reads next.

Real Kafka, real assigner and sidecar processes, real DsClients; every record is counted.
An application container restarting under load (chaos scenario 5) is
tests/chaos/test_chaos_app_restart.py.
"""

from __future__ import annotations

import time

import pytest

from dsclient import DsClient
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.producing import produce
from tests.support.records import value_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 3
RECORDS = 900
VISIBILITY = 30.0  # the default visibility timeout


def test_records_a_client_read_and_closed_without_acking_reach_the_next_client(
    mesh: Mesh, topic_factory: object
) -> None:
    """What a new user tried: a client reads records, acks none of them and closes; the
    next client of the group must receive every one of them, within the visibility
    timeout at most (at once, since the closing client's binding ended)."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value_of)
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
