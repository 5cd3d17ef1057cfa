"""Consumer sidecar acceptance: memory stays bounded whatever the backlog (ARCHITECTURE §3
"Backpressure").

A 1 GiB backlog (1 KiB values) on a real broker, one sidecar with the default buffer cap
(``buffer_max_bytes`` = 64 MiB) and an application that fetches and acks slowly: the
sidecar's resident memory, sampled every 0.5 s, stays under cap + 150 MiB.

Where it goes: ~75 MiB before any record (interpreter, gRPC, protobuf, librdkafka); the
buffer itself, whose records are column chunks (dsclient/records/batches.py) that take
what they are counted for; librdkafka's prefetch queue (``queued.max.messages.kbytes``,
8 MiB) and one fetch response in flight (``fetch.max.bytes``, 8 MiB); the heap malloc
keeps for reuse.
Records were one protobuf message each before, at about twice their counted size: the
peak was 200-215 MiB, now about 150-160 MiB.
"""

from __future__ import annotations

import time

import pytest

from dsclient import DsClient
from services.consumer_sidecar.settings import SidecarSettings
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.sidecar_probe import RssSampler, produce_bulk, status

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]

MiB = 1024 * 1024
PARTITIONS = 8
VALUE_SIZE = 1024
BACKLOG_BYTES = 1024 * MiB
HEADROOM = 150 * MiB
SLOW_FOR = 60.0  # seconds of slow consumption while sampling
CAP = int(SidecarSettings.model_fields["buffer_max_bytes"].default)


def test_rss_stays_under_the_buffer_cap_with_a_1gib_backlog(
    mesh: Mesh, topic_factory: object
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "mem-sc")
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["mem-sc"], PARTITIONS)
    assert sidecar.proc is not None
    sampler = RssSampler(sidecar.proc.pid, interval=0.5)
    time.sleep(2)
    baseline = sampler.rss()
    sampler.start()

    records = BACKLOG_BYTES // VALUE_SIZE
    produce_started = time.monotonic()
    took = produce_bulk(mesh.bootstrap, topic, records, VALUE_SIZE, PARTITIONS)
    print(
        f"produced {records} x {VALUE_SIZE} B = {records * VALUE_SIZE / MiB:.0f} MiB in "
        f"{took:.1f}s ({records * VALUE_SIZE / MiB / took:.0f} MiB/s)"
    )
    max_while_producing = sampler.max_since(produce_started)

    slow_started = time.monotonic()
    fetched = 0
    fetches = 0
    buffered_max = 0
    try:
        with DsClient(group, client_id="slow-app", assigner=assigner.grpc_addr) as client:
            while time.monotonic() - slow_started < SLOW_FOR:
                batch = client.fetch(max_records=200, max_wait=1.0)
                fetches += 1
                fetched += len(batch)
                time.sleep(0.25)  # the application is slow to process…
                if batch:
                    assert client.ack(batch) == len(batch)
                time.sleep(0.25)  # …and slow to come back
                if fetches % 10 == 0:
                    buffered_max = max(buffered_max, status(sidecar.grpc_addr).buffer_bytes)
    finally:
        sampler.stop()
    peak = sampler.max_since(0.0)
    peak_slow = sampler.max_since(slow_started)
    final = status(sidecar.grpc_addr)
    print(
        f"cap {CAP / MiB:.0f} MiB; sidecar RSS idle before the backlog {baseline / MiB:.1f} MiB, "
        f"max while producing {max_while_producing / MiB:.1f} MiB, max while consuming slowly "
        f"{peak_slow / MiB:.1f} MiB, max overall {peak / MiB:.1f} MiB over "
        f"{len(sampler.samples)} samples; limit cap + {HEADROOM / MiB:.0f} MiB = "
        f"{(CAP + HEADROOM) / MiB:.0f} MiB"
    )
    print(
        f"application fetched {fetched} records in {fetches} fetches over {SLOW_FOR:.0f}s; "
        f"sidecar buffer (Status) max sampled {buffered_max / MiB:.1f} MiB, at the end "
        f"{final.buffer_bytes / MiB:.1f} MiB of cap {final.buffer_cap_bytes / MiB:.0f} MiB, "
        f"paused partitions {sum(p.paused for p in final.partitions)}/{len(final.partitions)}"
    )
    assert fetched > 0, "the application received nothing"
    assert final.buffer_cap_bytes == CAP
    assert peak < CAP + HEADROOM, (
        f"sidecar RSS peaked at {peak / MiB:.1f} MiB > cap {CAP / MiB:.0f} MiB + "
        f"{HEADROOM / MiB:.0f} MiB"
    )
