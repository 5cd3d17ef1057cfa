"""Where ``DsClient.fetch`` waits (issue 22, item 5: the stall while a sidecar returns).

``fetch`` asks every bound sidecar without waiting, then long-polls one of them for the
rest of ``max_wait``. Which one used to be decided by the rotation alone, so a fetch
could spend its whole wait on a sidecar that had nothing to deliver — one whose
partitions were still on their way to it (a sidecar returning under ``hold_mode:
handoff``: the binding names its partitions before they are live there) — while the
records piled up on the others: every partition of the application stalled for up to
``max_wait``. The long poll now goes to the sidecar the binding gives partitions to that
delivered last.

Real Kafka, an assigner and two sidecars for a one-partition topic: one holds the
partition, the other holds nothing. A producer writes throughout; every fetch, given
2 s, must come back with records (a fetch that long-polled the idle sidecar comes back
empty after its 2 s while the other sidecar has some 200 records waiting).
"""

from __future__ import annotations

import time

import pytest

from dsclient import DsClient
from tests.support.assignment import wait_until
from tests.support.mesh import Mesh
from tests.support.records import SeqProducer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FETCHES = 12
RATE = 100.0  # records/s


def test_fetch_waits_on_the_sidecar_with_records_not_on_an_idle_one(
    mesh: Mesh, topic_factory: object
) -> None:
    topic = topic_factory(partitions=1)  # type: ignore[operator]
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = [mesh.sidecar(group, assigner, sid) for sid in ("lp-1", "lp-2")]
    for svc in sidecars:
        svc.wait_serving()
    _, view = wait_until(
        assigner.grpc_addr,
        group,
        lambda v: set(v.members) == {"lp-1", "lp-2"} and v.leases[0].granted,
        timeout=60,
    )
    holder = view.leases[0].holder
    producer = SeqProducer(mesh.bootstrap, topic, 1, rate=RATE).start()
    results: list[tuple[int, float, str]] = []
    try:
        with DsClient(group, client_id="long-poll-app", assigner=assigner.grpc_addr) as client:
            deadline = time.monotonic() + 30
            while not client.fetch(500, max_wait=1.0) and time.monotonic() < deadline:
                pass  # the first records: the client is bound and the partition live
            for _ in range(FETCHES):
                started = time.monotonic()
                batch = client.fetch(500, max_wait=2.0)
                results.append((len(batch), time.monotonic() - started, holder))
                if batch:
                    client.ack(batch)
    finally:
        producer.stop()
    empty = [round(took, 2) for n, took, _ in results if n == 0]
    print(
        f"{FETCHES} fetches (max_wait 2s, {RATE:.0f} records/s to the partition {holder} "
        f"holds): {len(empty)} empty, after {empty} s"
    )
    assert not empty, (
        f"{len(empty)} of {FETCHES} fetches long-polled the idle sidecar and came back "
        f"empty while {holder} had records: {results}"
    )
