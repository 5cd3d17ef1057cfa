"""The Spark source's group commit survives a lease move, on a real assigner, real sidecars
and a real broker (the CI failure of stop 44, `test_pipeline_exactly_once_through_driver_
and_sidecar_kills`: partition 0's committed offset stuck at 6,251 of 16,667).

A sidecar accepts a commit only from the client ReadRange gave every record of
``[committed, offset)`` to, under the current lease epoch (range_reads.py). Spark reads a
batch through the holder of the time and commits it later, when the next batch is planned;
if the holder died in between, the new holder (a new epoch) gave the reader nothing, and
refused the commit with REJECT_REASON_NOT_DELIVERED on every retry, forever. The source
now reads the uncommitted span again through the new holder, proving it, and commits."""

from __future__ import annotations

import pytest

from services.devstack.kafka import TopicFactory
from services.runtime.topic_partition import TP
from spark.sources.mesh import ReadPolicy, ReadSpec, commit_offsets, read_range, shared_mesh
from tests.support import producing
from tests.support.assignment import describe, wait_stable, wait_until
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 2
RECORDS = 2000


def test_a_range_read_before_the_holder_died_is_committed_through_the_next_holder(
    mesh: Mesh, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    producing.produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS)
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = {name: mesh.sidecar(group, assigner, name) for name in ("sc-0", "sc-1")}
    for sidecar in sidecars.values():
        sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, sidecars, PARTITIONS)
    victim = describe(assigner.grpc_addr, group).leases[0].holder
    survivor = next(name for name in sidecars if name != victim)

    reader = shared_mesh([assigner.grpc_addr], None, group, "spark-test")
    policy = ReadPolicy(chunk_bytes=1 << 16, read_timeout=60, fail_on_data_loss=True, arrow=False)
    half = RECORDS // PARTITIONS // 2
    tp = TP(topic, 0)
    read = [r.offset for c in read_range(reader, ReadSpec(topic, 0, 0, half, None), policy)
            for r in c.records]  # fmt: skip
    assert read == list(range(half))

    sidecars[victim].kill()
    wait_until(
        assigner.grpc_addr, group,
        lambda view: view.leases[0].holder == survivor and view.leases[0].granted, 60,
    )  # fmt: skip

    failed = commit_offsets(reader, {tp: half}, timeout=60)
    print(f"\nread [0, {half}) of p0 through {victim}, killed it; commit through {survivor}: "
          f"not committed {failed}")  # fmt: skip
    assert failed == {}
    assert committed_offsets(mesh.bootstrap, group, topic, PARTITIONS)[0] == half
