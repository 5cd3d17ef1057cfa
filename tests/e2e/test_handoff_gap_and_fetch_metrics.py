"""Issue 21 acceptance (leased mode, the handoff part of "not-fetching gap > 0 after a
lease handoff") and the fetch-manager / per-topic / per-partition fetch metrics, on the
real mesh: a producer writes, an application reads and acks, sidecar A holds the
partitions it was given; the application pauses and A hands every partition to sidecar B
(``dsctl handoff``, the preStop hook), the application reads on. B, scraped:
``ds_sidecar_handoff_gap_seconds`` counted each partition that moved with records waiting
for it, with a gap > 0; and the same scrape carries the fetch figures from librdkafka's
statistics with sane values (bytes and records per Fetch request > 0, every partition
fetched from its leader). Every record produced arrives, none twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.samples import Sample

from dsclient import DsClient
from services.dsctl.handoff import status
from tests.support.mesh import REPO, Mesh, ServiceProcess
from tests.support.ops import (
    metric_samples,
)
from tests.support.records import ConsumerLoop, SeqProducer, Tally, describe_missing, wait_received
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PARTITIONS = 4


def held(address: str) -> set[int]:
    return {p.partition for p in status(address).partitions}


def samples(sidecar: ServiceProcess, name: str, **labels: str) -> list[Sample]:
    return [s for s in metric_samples(sidecar, name) if labels.items() <= s.labels.items()]


def by_partition(sidecar: ServiceProcess, name: str, **labels: str) -> dict[int, float]:
    return {int(s.labels["partition"]): s.value for s in samples(sidecar, name, **labels)}


def test_a_lease_handoff_shows_its_gap_on_the_new_owner_beside_the_fetch_metrics(
    mesh: Mesh, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    config = tmp_path / "assigner.yaml"
    config.write_text(
        f"groups:\n  - name: {group}\n    topics: [{topic}]\nhold_window_seconds: 0\n"
    )
    assigner = mesh.service("assigner", "--config", str(config))
    assigner.wait_serving()
    fast_stats = {"DS_STATISTICS_INTERVAL_MS": "500"}
    leaving = mesh.sidecar(group, assigner, "sidecar-a", env=fast_stats)
    leaving.wait_serving()
    wait_for(lambda: held(leaving.grpc_addr) == set(range(PARTITIONS)), 60, "A to hold all")
    staying = mesh.sidecar(group, assigner, "sidecar-b", env=fast_stats)
    staying.wait_serving()
    # B's own grants land before any record is written: nothing waits for them, so the
    # handoff gaps B counts are the partitions that move to it below.
    wait_for(
        lambda: (
            held(leaving.grpc_addr) | held(staying.grpc_addr) == set(range(PARTITIONS))
            and held(staying.grpc_addr)
        ),
        60,
        "the assigner to give B its share",
    )

    client = DsClient(group, client_id="gap-app", assigner=assigner.grpc_addr)
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=300).start()
    tally = Tally()
    loop = ConsumerLoop(client, tally, max_records=200).start()
    try:
        time.sleep(3)
        # The application pauses for a moment: records wait in the moving partitions (with
        # it reading, A could have delivered and committed every record before the grant,
        # and B's first records would be written after it: no record waited, no gap).
        loop.stop()
        time.sleep(0.5)
        moving = held(leaving.grpc_addr)
        assert moving, "A holds nothing to hand off"
        hook = subprocess.run(
            [sys.executable, "-m", "services.dsctl", "handoff", "--sidecar", leaving.grpc_addr,
             "--assigner", assigner.grpc_addr, "--timeout", "20"],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        )  # fmt: skip
        assert hook.returncode == 0, hook.stderr
        wait_for(lambda: held(staying.grpc_addr) == set(range(PARTITIONS)), 20, "B to hold all")
        loop = ConsumerLoop(client, tally, max_records=200).start()  # the application again
        g = {"group": group, "topic": topic}
        seen: list[dict[int, float]] = [{}]

        def counted() -> dict[int, float] | None:
            seen[0] = by_partition(staying, "ds_sidecar_handoff_gap_seconds_count", **g)
            return seen[0] if set(seen[0]) == moving else None

        try:
            handoffs = wait_for(counted, 20, "B to count a handoff gap for each moved partition")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: moved {sorted(moving)}, B counted {seen[0]}") from None
        gaps = by_partition(staying, "ds_sidecar_handoff_gap_seconds_sum", **g)
        time.sleep(1.5)  # a few statistics windows of B fetching
    finally:
        produced = producer.stop()
        missing = wait_received(tally, produced, timeout=60)
        loop.stop()
        client.close()

    print(f"moved {sorted(moving)}; B's handoff gaps (count, seconds): "
          f"{ {p: (handoffs[p], round(gaps[p], 3)) for p in sorted(gaps)} }")  # fmt: skip
    assert all(handoffs[p] == 1.0 and gaps[p] > 0 for p in moving), (handoffs, gaps)

    # The fetch figures on the same sidecar.
    size_sum = samples(staying, "ds_sidecar_fetch_size_bytes_sum", **g)[0].value
    size_count = samples(staying, "ds_sidecar_fetch_size_bytes_count", **g)[0].value
    per_request = samples(staying, "ds_sidecar_fetch_records_per_request_sum", **g)[0].value
    all_count = samples(staying, "ds_sidecar_fetch_size_all_bytes_count", group=group)[0].value
    print(f"B: fetch-size-avg {size_sum / size_count:.1f} B over {size_count:.0f} windows, "
          f"records-per-request-avg {per_request / size_count:.2f}, "
          f"all-topics windows {all_count:.0f}")  # fmt: skip
    assert size_count > 0 and size_sum > 0 and per_request > 0 and all_count > 0
    metadata = AdminClient({"bootstrap.servers": mesh.bootstrap}).list_topics(topic, timeout=10)
    leaders = {p: float(m.leader) for p, m in metadata.topics[topic].partitions.items()}
    fetch_brokers = by_partition(staying, "ds_sidecar_partition_fetch_broker", **g)
    print(f"B: fetch broker per partition {fetch_brokers}, leaders {leaders}")
    assert fetch_brokers == leaders
    assert by_partition(staying, "ds_sidecar_partition_leader", **g) == leaders

    summary = (
        f"produced {len(produced)}, received {len(tally.received())}, "
        f"deliveries {len(tally.deliveries)}, duplicates {tally.duplicate_count()}"
    )
    print(summary)
    assert not loop.errors, f"the application saw errors: {loop.errors!r}"
    assert not missing, describe_missing(missing, PARTITIONS, producer=producer, tally=tally)
    assert not tally.duplicates(), f"records delivered twice: {summary}"
