"""The distribution job on a deliberately skewed key set (one key carries 50 % of the
records), read through the mesh's sidecars by a real local Spark: the figures it computes
(key share, Gini, max/mean, per-partition counts and skew, the group's lag) equal the ones
computed here from what was produced, and the report shows them."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Message

from services.devstack.kafka import TopicFactory
from spark.jobs.skew import gini, skew_of
from spark.sources.mesh import ReadPolicy, ReadSpec, read_range, shared_mesh
from spark.sources.mesh import commit_offsets as commit_group_offsets
from tests.spark.support import SPARK_FLAGS, SparkJob
from tests.support import producing
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]

PARTITIONS = 6
HOT_RECORDS = 10_000
COLD_KEYS = 100
COLD_RECORDS_EACH = 100
VALUE = b"v" * 40


def produce_skewed(bootstrap: str, topic: str) -> dict[int, collections.Counter[str]]:
    """Keys per partition as Kafka placed them (the default key-hash partitioner)."""
    placed: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def delivered(_n: int, msg: Message) -> None:
        placed[int(msg.partition() or 0)][(msg.key() or b"").decode()] += 1

    # Every other record is the hot key; the others cycle through the cold keys.
    producing.produce(
        bootstrap,
        topic,
        range(2 * HOT_RECORDS),
        key=lambda n: ("hot" if n % 2 == 0 else f"k{(n // 2) % COLD_KEYS:03d}").encode(),
        value=lambda _n: VALUE,
        linger_ms=20,
        flush_timeout=60,
        delivered=delivered,
    )
    return placed


def test_distribution_report_on_a_skewed_key_set(
    mesh: Mesh, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    placed = produce_skewed(mesh.bootstrap, topic)
    per_partition = {p: sum(c.values()) for p, c in placed.items()}
    per_key: collections.Counter[str] = collections.Counter()
    for counter in placed.values():
        per_key.update(counter)
    total = sum(per_key.values())
    assert total == HOT_RECORDS + COLD_KEYS * COLD_RECORDS_EACH and per_key["hot"] == total // 2

    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = {f"sc-{i}": mesh.sidecar(group, assigner, f"sc-{i}") for i in range(2)}
    for sidecar in sidecars.values():
        sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, sidecars, PARTITIONS)
    # Some progress in the group, so the lag is not simply "everything".
    progress = {(topic, p): per_partition.get(p, 0) // 2 for p in (0, 1)}
    test_mesh = shared_mesh([assigner.grpc_addr], None, group, "distribution-test")
    # Read, then commit, as a reader does: commits are bound to the client that read.
    policy = ReadPolicy(chunk_bytes=1 << 20, read_timeout=60, fail_on_data_loss=True, arrow=False)
    for (t, p), offset in progress.items():
        chunks = read_range(test_mesh, ReadSpec(t, p, 0, offset, None), policy)
        assert sum(len(chunk.records) for chunk in chunks) == offset
    assert commit_group_offsets(test_mesh, progress, timeout=60) == {}

    out = tmp_path / "report"
    job = SparkJob(
        "distribution",
        ["--assigner", assigner.grpc_addr, "--group", group, "--output", str(out),
         "--window", "5", "--top-keys", "5", "--lag-interval", "1", *SPARK_FLAGS],
        tmp_path / "distribution.log",
    ).start()  # fmt: skip
    try:
        assert job.wait(480) == 0, job.tail()
    finally:
        job.stop()

    summary = json.loads((out / "summary.json").read_text())
    figures = summary["topics"][topic]
    assert figures["records"] == total
    assert figures["bytes"] == sum(len(k) * n + len(VALUE) * n for k, n in per_key.items())
    keys = figures["keys"]
    assert keys["distinct"] == COLD_KEYS + 1
    assert keys["top"][0] == {
        "key": "hot",
        "records": HOT_RECORDS,
        "bytes": HOT_RECORDS * (3 + len(VALUE)),
        "share": 0.5,
    }
    assert [k["share"] for k in keys["top"][1:]] == [COLD_RECORDS_EACH / total] * 4
    # Gini over 101 keys, one with n/2: computed here from the counts, and in closed form.
    assert keys["gini"] == pytest.approx(gini(per_key.values()))
    n = COLD_KEYS + 1
    closed = 2 * (COLD_RECORDS_EACH * sum(range(1, n)) + n * HOT_RECORDS) / (n * total)
    assert keys["gini"] == pytest.approx(closed - (n + 1) / n)
    assert keys["max_over_mean"] == pytest.approx(HOT_RECORDS / (total / n))  # 50.5
    partitions = figures["partitions"]
    assert partitions["records"] == {str(p): c for p, c in sorted(per_partition.items())}
    expected_skew = skew_of(per_partition)
    assert partitions["max_over_mean"] == pytest.approx(expected_skew.max_over_mean)
    assert partitions["gini"] == pytest.approx(expected_skew.gini)
    assert partitions["cv"] == pytest.approx(expected_skew.cv)
    hot_partition = next(p for p, c in placed.items() if c["hot"])
    assert per_partition[hot_partition] == max(per_partition.values())

    # The lag from the group's offsets: what was committed above, everything elsewhere.
    lag = summary["lag"]
    assert lag["samples"] >= 2
    for p in range(PARTITIONS):
        end = per_partition.get(p, 0)
        committed = progress.get((topic, p), -1)
        assert lag["partitions"][f"{topic}[{p}]"] == {
            "committed": committed,
            "end": end,
            "lag": end - max(committed, 0),
        }

    # Outputs: Parquet tables, plots, the HTML report.
    assert pq.read_table(out / "keys").num_rows == COLD_KEYS + 1
    assert pq.read_table(out / "partitions.parquet").num_rows == len(per_partition)
    rates = pq.read_table(out / "rates.parquet").to_pylist()
    assert sum(r["records"] for r in rates) == total
    key_rates = pq.read_table(out / "key_rates.parquet").to_pylist()
    assert sum(r["records"] for r in key_rates if r["key"] == "hot") == HOT_RECORDS
    for name in ("distribution.png", "rates.png", "lag.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = (out / "report.html").read_text()
    assert "<td>hot</td>" in report and "<td>0.500</td>" in report
    assert f"{keys['gini']:.3f}" in report and "plots/distribution.png" in report
    print(
        f"\nkey share {keys['top'][0]['share']}, key Gini {keys['gini']:.4f}, key max/mean "
        f"{keys['max_over_mean']:.2f}; partitions {partitions['records']} max/mean "
        f"{partitions['max_over_mean']:.2f} Gini {partitions['gini']:.4f}; lag {lag['total_lag']}"
    )
