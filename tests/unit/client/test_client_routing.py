"""Where DsClient sends an ack: to the sidecar that delivered the records, under their epoch.

Real sidecar servicers in-process (``inprocess.py``); the client is the real DsClient.
"""

from __future__ import annotations

import time

from dsclient import Batch, DsClient
from tests.unit.client.inprocess import in_process_mesh
from tests.unit.sidecar.stream_harness import GROUP


def fetch_from(client: DsClient, address: str, mesh_addresses: list[str]) -> Batch:
    """Fetch until a batch arrives (the client asks its sidecars in turn)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = client.fetch(max_records=100, max_wait=0.2)
        if batch:
            return batch
    raise AssertionError(f"nothing fetched from {address} in 10 s")


def test_acks_go_to_the_sidecar_that_delivered_them_after_the_partition_moved() -> None:
    """Partition 0 was delivered by sidecar A under epoch 1, then by sidecar B under
    epoch 2 (it moved). The acks of A's records go to A, which delivered them, not to B,
    which refuses an epoch-1 ack as stale (the records would be delivered again for no
    reason)."""
    with in_process_mesh(2) as mesh:
        a, b = mesh.sidecars
        a.hold(0, epoch=1, start=0)
        a.buffer(0, range(0, 5))
        with DsClient(GROUP, client_id="app", assigner=mesh.assigner) as client:
            first = fetch_from(client, mesh.addresses[0], mesh.addresses)
            assert {(r.partition, r.lease_epoch) for r in first} == {(0, 1)}
            # The partition moves: B holds it under epoch 2 and delivers what follows.
            b.hold(0, epoch=2, start=5)
            b.buffer(0, range(5, 8))
            second = fetch_from(client, mesh.addresses[1], mesh.addresses)
            assert {(r.partition, r.lease_epoch) for r in second} == {(0, 2)}
            assert client.ack(first) == len(first) == 5
            assert client.ack(second) == len(second) == 3
        part_a = mesh.on_loop(lambda: a.table.get(a.table.snapshot()[0].tp))
        assert part_a is not None and part_a.acks.commit_point == 5
