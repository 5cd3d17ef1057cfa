"""Coordinator metrics of real sidecars in both modes (issue 21, item 1), after real
traffic and a rebalance: a first sidecar joins and serves half of the records, a second
joins (leased: the assigner moves leases to it; kafka_group: Kafka's cooperative-sticky
rebalance), the rest is read through both, and both sidecars' /metrics show the joins,
their join and sync latencies, the rebalance's partition changes and the last heartbeat.
Then partitions are lost (leased: the assigner stalls past the lease TTL, so every lease
expires locally; kafka_group: the second sidecar stalls past session.timeout.ms, so Kafka
drops it and librdkafka calls on_lost when it runs again) and their latency is there.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dsclient import DsClient
from tests.support import accounting
from tests.support.group_modes import GroupSpec, start_assigner
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.ops import (
    metric_samples,
    metrics,
    table_problems,
)
from tests.support.producing import produce
from tests.support.sidecar_probe import start_sidecar
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PARTITIONS = 4
RECORDS = 400
GROUP_CONFIG = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
# Stalls past the lease TTL (3 s, the assigner's default) and past session.timeout.ms.
STALL = {"leased": 5.0, "kafka_group": 9.0}
# librdkafka statistics every 0.5 s (default 5 s), so the statistics' metrics are there soon.
STATS = {"DS_STATISTICS_INTERVAL_MS": "500"}
# Metrics of events this run has none of before the stall (declared, no series yet).
EVENT_ONLY = {
    "ds_sidecar_kafka_errors_total",
    "ds_sidecar_offset_gaps_total",
    "ds_partition_not_fetching_seconds",
    "ds_sidecar_handoff_gap_seconds",
}


def value(sidecar: ServiceProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels`` (0 when none)."""
    return total(metric_samples(sidecar, name), **labels)


def total(samples: Iterable[Sample], **labels: str) -> float:
    return sum(s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items()))


def read(client: DsClient, seen: set[int], until: int, timeout: float) -> int:
    """Fetch and ack until ``until`` distinct records were seen; the deliveries made."""
    deliveries = 0
    deadline = time.monotonic() + timeout
    while len(seen) < until and time.monotonic() < deadline:
        batch = client.fetch(max_records=100, max_wait=0.5)
        deliveries += len(batch)
        seen.update(int(r.key.decode()) for r in batch)
        if batch:
            client.ack(batch)
    return deliveries


COORDINATOR = (
    "ds_sidecar_join_seconds_count",
    "ds_sidecar_join_seconds_sum",
    "ds_sidecar_sync_seconds_count",
    "ds_sidecar_sync_seconds_sum",
    "ds_sidecar_last_heartbeat_timestamp_seconds",
    "ds_sidecar_partitions_lost_seconds_count",
    "ds_sidecar_partitions_lost_seconds_sum",
)


def figures(sidecar: ServiceProcess, group: str) -> dict[str, float]:
    """The coordinator figures of one scrape."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(metrics(sidecar)):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    g = {"group": group}
    out = {name: total(samples.get(name, []), **g) for name in COORDINATOR}
    joins = samples.get("ds_sidecar_joins_total", [])
    out["joins_ok"] = total(joins, result="ok", **g)
    out["joins_error"] = total(joins, result="error", **g)
    for kind in ("grant", "revoke", "expire"):
        out[kind] = total(samples.get("ds_sidecar_lease_changes_total", []), kind=kind, **g)
        out[f"{kind}_latency_count"] = total(
            samples.get("ds_sidecar_lease_change_latency_seconds_count", []), kind=kind, **g
        )
    return out


def stall(service: ServiceProcess, seconds: float) -> None:
    """Stop ``service`` (SIGSTOP) for ``seconds``, then let it run again."""
    assert service.pid is not None
    os.kill(service.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(service.pid, signal.SIGCONT)


@pytest.mark.parametrize("mode", ["leased", "kafka_group"])
def test_coordinator_metrics_after_traffic_and_a_rebalance(
    mesh: Mesh, topic_factory: Any, mode: str
) -> None:
    started_at = time.time()
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS)
    assigner = start_assigner(mesh, [GroupSpec(group, [topic], mode, GROUP_CONFIG)])
    assigner.wait_serving()
    first = start_sidecar(mesh, group, assigner, "sidecar-a", env=STATS)
    first.wait_serving()
    seen: set[int] = set()
    deliveries = 0
    with DsClient(group, client_id="app", assigner=assigner.grpc_addr) as client:
        deliveries += read(client, seen, RECORDS // 2, 60)
        assert len(seen) >= RECORDS // 2, f"only {len(seen)} records through the first sidecar"

        # The rebalance: a second member joins and takes partitions from the first.
        second = start_sidecar(mesh, group, assigner, "sidecar-b", env=STATS)
        second.wait_serving()
        wait_for(
            lambda: (
                value(second, "ds_sidecar_assigned_partitions", group=group) > 0
                and value(first, "ds_sidecar_lease_changes_total", kind="revoke", group=group) > 0
            ),
            60,
            "partitions moved to the second sidecar",
        )
        deliveries += read(client, seen, RECORDS, 60)
    accounting.report(
        f"coordinator metrics ({mode}): produced {RECORDS}, received {len(seen)} distinct "
        f"in {deliveries} deliveries (redelivered across the rebalance: "
        f"{deliveries - len(seen)})"
    )
    assert seen == set(range(RECORDS)), f"{RECORDS - len(seen)} records never arrived"

    # Every metric of the table on both sidecars, in either mode, after traffic and the
    # rebalance (only metrics of events a healthy run has none of may have no series).
    for sidecar in (first, second):
        # Statistics' metrics come with the first statistics after the (re)assignment.
        deadline = time.monotonic() + 10
        while (problems := table_problems(sidecar, EVENT_ONLY)) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not problems, f"{mode} {sidecar.log.stem}: {problems}"
    a, b = figures(first, group), figures(second, group)
    for name, f in (("sidecar-a", a), ("sidecar-b", b)):
        shown = ", ".join(f"{k.removeprefix('ds_sidecar_')}={v:g}" for k, v in f.items())
        accounting.report(f"coordinator metrics ({mode}) {name}: {shown}")
    for name, f in (("sidecar-a", a), ("sidecar-b", b)):
        assert f["joins_ok"] >= 1, f"{name}: no join counted"
        assert f["joins_error"] == 0, f"{name}: a failed join in a healthy run"
        assert f["ds_sidecar_join_seconds_count"] >= 1, f"{name}: no join timed"
        assert f["ds_sidecar_join_seconds_sum"] > 0, f"{name}: joins took no time"
        assert f["ds_sidecar_sync_seconds_count"] >= 1, f"{name}: no sync timed"
        assert f["ds_sidecar_sync_seconds_sum"] > 0, f"{name}: syncs took no time"
        assert f["ds_sidecar_last_heartbeat_timestamp_seconds"] >= started_at
        assert f["ds_sidecar_last_heartbeat_timestamp_seconds"] <= time.time()
        assert f["grant"] >= 1 and f["grant_latency_count"] == f["grant"]
        assert f["ds_sidecar_partitions_lost_seconds_count"] == 0 == f["expire"]
    # The rebalance: the first sidecar handed partitions back, the second took them.
    assert a["revoke"] >= 1 and a["revoke_latency_count"] == a["revoke"]
    assert a["grant"] - a["revoke"] + b["grant"] - b["revoke"] == PARTITIONS
    if mode == "kafka_group":
        # Kafka's rounds: the first member's initial one and the rebalance's.
        assert a["joins_ok"] >= 2, "the rebalance was not counted as a join"
    else:
        # One session each: one Join, one first grant.
        assert a["joins_ok"] == 1 and a["ds_sidecar_sync_seconds_count"] == 1

    # ---- partitions lost ---------------------------------------------------------------------
    # leased: both sidecars' leases expire while the assigner stalls; kafka_group: Kafka drops
    # the stalled second member, whose partitions are lost when it runs again.
    stall(assigner if mode == "leased" else second, STALL[mode])
    losers = (first, second) if mode == "leased" else (second,)
    for loser in losers:
        wait_for(
            lambda loser=loser: value(loser, "ds_sidecar_partitions_lost_seconds_count") > 0,
            30,
            "partitions lost",
        )
        f = figures(loser, group)
        shown = ", ".join(f"{k.removeprefix('ds_sidecar_')}={v:g}" for k, v in f.items())
        accounting.report(f"coordinator metrics ({mode}) after the stall: {shown}")
        lost = f["ds_sidecar_partitions_lost_seconds_count"]
        assert lost == f["expire"], "one latency per partition lost"
        assert f["ds_sidecar_partitions_lost_seconds_sum"] > 0
        if mode == "kafka_group":
            assert f["joins_error"] >= 1, "on_lost is a failed rebalance"
