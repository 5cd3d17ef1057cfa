"""A real sidecar's /metrics after real traffic: every metric of METRIC_TABLE (the metric
reference) is there, with its type, and the figures agree with what was produced, fetched,
streamed and acked.

Two clients read one group: ``fetch-app`` (``Fetch`` + ``Ack``) the first half of the
records, ``stream-app`` (``Stream`` with acks on the stream) the second half. Then a bad
request and, past the client-id limit (3 here), a client reported as ``other``.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import DsClient
from services.consumer_sidecar.client_access import OTHER_CLIENT
from services.consumer_sidecar.metric_table import METRIC_TABLE
from tests.support import producing
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.sidecar_probe import start_sidecar
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 6
HALF = 900  # records per client
# Metrics of events a healthy run has none of: declared (HELP and TYPE), no series yet. Their
# labels are not known in advance (a partition with a gap, a client that had records due).
EVENT_ONLY = {
    "ds_sidecar_kafka_errors_total",
    "ds_sidecar_offset_gaps_total",
    "ds_partition_not_fetching_seconds",
    "ds_sidecar_handoff_gap_seconds",  # granted before any record was written: none waited
}


def produce(bootstrap: str, topic: str, first: int, count: int) -> int:
    """``count`` keyed records spread over the partitions; their key + value bytes."""
    seqs = range(first, first + count)

    def value(seq: int) -> bytes:
        return f"value-{seq}-{'x' * (seq % 40)}".encode()

    producing.produce(bootstrap, topic, seqs, partitions=PARTITIONS, value=value)
    return sum(len(str(seq).encode()) + len(value(seq)) for seq in seqs)


def scrape(sidecar: ServiceProcess) -> dict[str, tuple[str, list[Sample]]]:
    """family name → (type, samples), as Prometheus would read them."""
    url = f"http://127.0.0.1:{sidecar.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def family_name(name: str, kind: str) -> str:
    return name.removesuffix("_total") if kind == "counter" else name


def values(
    families: dict[str, tuple[str, list[Sample]]], sample: str, **labels: str
) -> list[float]:
    """Values of the samples named ``sample`` whose labels include ``labels``."""
    family = sample
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        family = family.removesuffix(suffix)
    found = families.get(family) or families.get(sample) or ("", [])
    return [
        s.value
        for s in found[1]
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def one(families: dict[str, tuple[str, list[Sample]]], sample: str, **labels: str) -> float:
    found = values(families, sample, **labels)
    assert len(found) == 1, f"{sample}{labels}: {found}"
    return found[0]


def total(families: dict[str, tuple[str, list[Sample]]], sample: str, **labels: str) -> float:
    return sum(values(families, sample, **labels))


def read_all(batches: Iterable[Any], client: DsClient, want: int) -> int:
    got = 0
    for batch in batches:
        assert client.ack(batch) == len(batch)
        got += len(batch)
        if got >= want:
            break
    return got


def test_every_table_metric_after_fetch_and_stream_traffic(mesh: Mesh, topic_factory: Any) -> None:
    started_at = time.time()
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = start_sidecar(
        mesh,
        group,
        assigner,
        "sidecar-metrics",
        env={"DS_STATISTICS_INTERVAL_MS": "500", "DS_METRICS_MAX_CLIENT_IDS": "3"},
    )
    sidecar.wait_serving()
    size = produce(mesh.bootstrap, topic, 0, HALF)

    with DsClient(group, client_id="fetch-app", assigner=assigner.grpc_addr) as client:
        got = 0
        deadline = time.monotonic() + 60
        while got < HALF and time.monotonic() < deadline:
            batch = client.fetch(300, max_wait=1.0)
            if batch:
                assert client.ack(batch) == len(batch)
                got += len(batch)
        assert got == HALF

    size += produce(mesh.bootstrap, topic, HALF, HALF)
    client = DsClient(group, client_id="stream-app", assigner=assigner.grpc_addr)
    watchdog = threading.Timer(90, client.close)
    watchdog.start()
    try:
        assert read_all(client.stream(200, use_stream_rpc=True), client, HALF) == HALF
    finally:
        watchdog.cancel()
        client.close()

    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Fetch(stream_pb2.FetchRequest(client_id="bad-app", group="nope"), timeout=5)
        bad_code = refused.value.code().name
        # A fourth client id: past the limit of 3, reported as "other".
        stub.Fetch(
            stream_pb2.FetchRequest(client_id="late-app", group=group, max_wait={}), timeout=5
        )

    produced = 2 * HALF

    def settled() -> bool:
        families = scrape(sidecar)
        lags = values(families, "ds_sidecar_records_lag")
        return (
            len(lags) == PARTITIONS
            and values(families, "ds_sidecar_records_lag_max") == [0.0]
            and values(families, "ds_client_active_streams", client_id="stream-app") == [0.0]
            and total(families, "ds_sidecar_commits_total", result="ok") > 0
        )

    wait_for(settled, 30, "lag 0 on every partition and the stream closed")
    families = scrape(sidecar)

    # ---- every metric of the table, with its type -----------------------------------------
    for spec in METRIC_TABLE:
        name = family_name(spec.name, spec.type)
        assert name in families, f"{spec.name} missing from /metrics"
        assert families[name][0] == spec.type, f"{spec.name}: {families[name][0]} != {spec.type}"
        samples = families[name][1]
        if spec.name in EVENT_ONLY:
            continue  # no such event in a healthy run: declared, no series
        assert samples, f"{spec.name} has no series"
        for sample in samples:
            assert set(spec.labels) <= set(sample.labels), f"{sample} lacks {spec.labels}"

    g = {"group": group}
    # ---- consumption -----------------------------------------------------------------------
    assert one(families, "ds_sidecar_records_consumed_total", topic=topic, **g) == produced
    assert one(families, "ds_sidecar_bytes_consumed_total", topic=topic, **g) == size
    assert one(families, "ds_sidecar_assigned_partitions", **g) == PARTITIONS
    assert sorted(values(families, "ds_sidecar_records_lag", **g)) == [0.0] * PARTITIONS
    leads = values(families, "ds_sidecar_records_lead", **g)
    assert len(leads) == PARTITIONS and sum(leads) == produced  # a fresh topic starts at 0
    assert one(families, "ds_sidecar_records_lead_min", **g) == min(leads)
    assert total(families, "ds_sidecar_buffered_records", **g) == 0
    assert one(families, "ds_sidecar_buffer_bytes", **g) == 0
    assert one(families, "ds_sidecar_buffer_limit_bytes", **g) > 0
    # ---- commits, leases, polls, session ---------------------------------------------------
    ok_commits = one(families, "ds_sidecar_commits_total", result="ok", **g)
    error_commits = one(families, "ds_sidecar_commits_total", result="error", **g)
    assert ok_commits > 0 and error_commits == 0
    assert one(families, "ds_sidecar_commit_latency_seconds_count", **g) == ok_commits
    assert one(families, "ds_sidecar_lease_changes_total", kind="grant", **g) == PARTITIONS
    assert one(families, "ds_sidecar_lease_changes_total", kind="revoke", **g) == 0
    assert one(families, "ds_sidecar_lease_changes_total", kind="expire", **g) == 0
    grants = one(families, "ds_sidecar_lease_change_latency_seconds_count", kind="grant", **g)
    assert grants == PARTITIONS
    assert one(families, "ds_sidecar_last_lease_change_timestamp_seconds", **g) >= started_at
    assert one(families, "ds_sidecar_poll_interval_seconds_count", **g) > 0
    assert one(families, "ds_sidecar_poll_wait_seconds_total", **g) > 0
    assert 0 <= one(families, "ds_sidecar_last_poll_age_seconds", **g) < 60
    heartbeats = one(families, "ds_sidecar_heartbeats_total", **g)
    assert heartbeats > 0
    assert 0 < one(families, "ds_sidecar_heartbeat_response_seconds_count", **g) <= heartbeats
    assert one(families, "ds_sidecar_assigner_connected", **g) == 1
    # ---- coordinator: one session, one Join, its first grant; no lease lost -----------------
    assert one(families, "ds_sidecar_joins_total", result="ok", **g) == 1
    assert one(families, "ds_sidecar_joins_total", result="error", **g) == 0
    assert one(families, "ds_sidecar_join_seconds_count", **g) == 1
    assert one(families, "ds_sidecar_join_seconds_sum", **g) > 0
    assert one(families, "ds_sidecar_sync_seconds_count", **g) == 1
    assert one(families, "ds_sidecar_sync_seconds_sum", **g) > 0
    assert one(families, "ds_sidecar_last_heartbeat_timestamp_seconds", **g) >= started_at
    assert one(families, "ds_sidecar_partitions_lost_seconds_count", **g) == 0
    # ---- librdkafka statistics -------------------------------------------------------------
    assert total(families, "ds_sidecar_fetch_requests_total", **g) > 0
    assert total(families, "ds_sidecar_broker_responses_total", **g) > 0
    # Compressed and varint-encoded on the wire: not comparable with key + value sizes.
    assert total(families, "ds_sidecar_broker_received_bytes_total", **g) > 0
    assert total(families, "ds_sidecar_broker_rtt_seconds_count", **g) > 0
    assert total(families, "ds_sidecar_broker_rtt_seconds_sum", **g) > 0
    # Every request counted, Fetch among them; the one broker connected.
    requests = total(families, "ds_sidecar_broker_requests_total", **g)
    assert requests >= total(families, "ds_sidecar_fetch_requests_total", **g)
    assert total(families, "ds_sidecar_broker_sent_bytes_total", **g) > requests
    assert total(families, "ds_sidecar_broker_connected", **g) == 1
    assert total(families, "ds_sidecar_broker_connects_total", **g) >= 1
    # ---- record age ------------------------------------------------------------------------
    assert one(families, "ds_sidecar_record_age_seconds_count", **g) == produced
    assert one(families, "ds_sidecar_record_age_seconds_bucket", le="+Inf", **g) == produced
    assert one(families, "ds_sidecar_record_age_seconds_sum", **g) > 0
    # ---- client access ---------------------------------------------------------------------
    for client_id, method in (("fetch-app", "Fetch"), ("stream-app", "Stream")):
        c = {"client_id": client_id, **g}
        assert one(families, "ds_client_records_served_total", **c) == HALF
        assert one(families, "ds_client_acks_total", **c) == HALF
        assert one(families, "ds_client_redeliveries_total", **c) == 0
        assert one(families, "ds_client_bytes_served_total", **c) > 0
        assert one(families, "ds_client_last_seen_timestamp_seconds", **c) >= started_at
        assert total(families, "ds_client_requests_total", method=method, **c) >= 1
        assert total(families, "ds_client_request_duration_seconds_count", method=method, **c) >= 1
    served = sum(
        one(families, "ds_client_bytes_served_total", client_id=c, **g)
        for c in ("fetch-app", "stream-app")
    )
    assert served == size
    assert total(families, "ds_client_requests_total", method="Ack", code="OK",
                 client_id="fetch-app", **g) >= 1  # fmt: skip
    assert one(families, "ds_client_active_streams", client_id="stream-app", **g) == 0
    bad = {"client_id": "bad-app", "method": "Fetch", "code": bad_code}
    assert one(families, "ds_client_requests_total", **bad, **g) == 1
    assert values(families, "ds_client_requests_total", client_id="late-app") == []
    assert total(families, "ds_client_requests_total", client_id=OTHER_CLIENT, method="Fetch") >= 1
