"""Benchmark: Spark records/s through the ``dataservice`` source vs Spark's own Kafka source.

    .venv/bin/python tests/bench/bench_spark.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap), produces N records of 100 B to a
12-partition topic, starts the mesh (an assigner and sidecars holding the group's leases)
and one local Spark session (``local[2]``) with ``spark-sql-kafka-0-10`` at the same Spark
version (fetched from Maven Central, ``deploy/spark/pom.xml``). Then, alternately, the
same streaming query over the same topic:

(a) baseline: ``format("kafka")`` (Spark's source, reading Kafka directly);
(b) ``format("dataservice")`` (ReadRange through the sidecars in ``ARROW_IPC`` chunks, the
    source's default ``readFormat auto``);
(c) the same with ``readFormat records`` (protobuf records, Arrow batches built in Python
    on the executor): what ``ARROW_IPC`` changes, in the same run;

each ``Trigger.AvailableNow`` from the earliest offsets in batches of N/4 records into
the ``noop`` sink, timed from ``start()`` to termination with the row count checked.
Prints records/s of each (best of the rounds, and the median) and the ratios to (a); the
issue's aim is ≥ 0.8.
Never asserts a time (CONVENTIONS "Tests"). Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession

from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic, delete_topic
from spark.jobs.common import build_session
from spark.kafka_jars import ensure_spark_kafka_jars
from tests.support.assignment import wait_stable
from tests.support.mesh import running_mesh
from tests.support.sidecar_probe import produce_bulk

PARTITIONS = 12
VALUE_SIZE = 100


@dataclass(frozen=True)
class Profile:
    records: int
    rounds: int
    sidecars: int


SHORT = Profile(records=200_000, rounds=1, sidecars=2)
FULL = Profile(records=1_000_000, rounds=3, sidecars=3)


@dataclass(frozen=True)
class Run:
    source: str
    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def timed_query(spark: SparkSession, name: str, frame: DataFrame, checkpoint: Path) -> Run:
    started = time.monotonic()
    query = (
        frame.writeStream.format("noop")
        .queryName(name.replace("-", "_"))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.monotonic() - started
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")
    progress = query.recentProgress
    rows = sum(int(p["numInputRows"]) for p in progress)
    if os.environ.get("BENCH_VERBOSE"):
        for p in progress:
            print(f"  {name} batch {p['batchId']}: {p['numInputRows']} rows {p['durationMs']}")
    return Run(name, rows, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use a running Kafka instead of starting one")
    args = parser.parse_args()
    profile = SHORT if args.short else FULL
    jars = ensure_spark_kafka_jars()

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        base = Path(tmp)
        cluster: KafkaCluster | None = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            cluster = KafkaCluster(KafkaOptions(base_dir=base / "kafka")).start()
            bootstrap = cluster.bootstrap
        topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
        group = f"g-{topic}"
        try:
            create_topic(bootstrap, topic, PARTITIONS)
            seconds = produce_bulk(bootstrap, topic, profile.records, VALUE_SIZE, PARTITIONS)
            print(f"produced {profile.records:,} records of {VALUE_SIZE} B in {seconds:.1f} s")
            with running_mesh(bootstrap, base) as mesh:
                assigner = mesh.assigner([(group, [topic])])
                assigner.wait_serving()
                ids = [f"bench-sc-{i}" for i in range(profile.sidecars)]
                for sidecar in [mesh.sidecar(group, assigner, i) for i in ids]:
                    sidecar.wait_serving()
                wait_stable(assigner.grpc_addr, group, ids, PARTITIONS)
                runs = measure(base, bootstrap, assigner.grpc_addr, group, topic, jars, profile)
        finally:
            if args.bootstrap is not None:
                delete_topic(bootstrap, topic)
            if cluster is not None:
                cluster.stop()
    report(runs, profile)
    return 0


def measure(
    base: Path,
    bootstrap: str,
    assigner: str,
    group: str,
    topic: str,
    jars: list[Path],
    profile: Profile,
) -> list[Run]:
    per_trigger = max(1, profile.records // 4)
    spark = build_session(
        "bench-spark",
        "local[2]",
        4,
        {
            "spark.jars": ",".join(str(j) for j in jars),
            "spark.ui.enabled": "false",
        },
    )

    def kafka() -> DataFrame:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", per_trigger)
            .load()
        )

    def dataservice(read_format: str) -> Callable[[], DataFrame]:
        def frame() -> DataFrame:
            return (
                spark.readStream.format("dataservice")
                .option("assigner", assigner)
                .option("group", group)
                .option("startingOffsets", "earliest")
                .option("maxRecordsPerTrigger", per_trigger)
                .option("readFormat", read_format)
                .load()
            )

        return frame

    sources: list[tuple[str, Callable[[], DataFrame]]] = [
        ("kafka", kafka),
        ("dataservice", dataservice("auto")),
        ("ds-records", dataservice("records")),
    ]
    # Warm-up: a small batch read through each source (JVM classes, Python workers).
    head = json.dumps({topic: {str(p): 100 for p in range(PARTITIONS)}})
    warm_kafka = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("endingOffsets", head)
        .load()
    )
    warm_ds = (
        spark.read.format("dataservice")
        .option("assigner", assigner)
        .option("group", group)
        .option("endingOffsets", head)
        .load()
    )
    for frame in (warm_kafka, warm_ds):
        assert frame.count() == 100 * PARTITIONS
    runs = []
    for round_no in range(profile.rounds):
        order = sources if round_no % 2 == 0 else list(reversed(sources))
        for name, make_frame in order:
            run = timed_query(spark, name, make_frame(), base / f"ck-{name}-{round_no}")
            if run.records != profile.records:
                raise RuntimeError(f"{name} read {run.records} records, not {profile.records}")
            print(f"round {round_no}: {name:<12} {run.per_second:>10,.0f} rec/s "
                  f"({run.records:,} in {run.seconds:.2f} s)")  # fmt: skip
            runs.append(run)
    spark.stop()
    return runs


def report(runs: list[Run], profile: Profile) -> None:
    rates = {
        source: [r.per_second for r in runs if r.source == source]
        for source in ("kafka", "dataservice", "ds-records")
    }
    best = {source: max(values) for source, values in rates.items()}
    median = {source: statistics.median(values) for source, values in rates.items()}
    print()
    print(f"Spark source throughput, {profile.records:,} records of {VALUE_SIZE} B, "
          f"{PARTITIONS} partitions, local[2], {profile.sidecars} sidecars, "
          f"{profile.rounds} round(s), best / median:")  # fmt: skip
    rows = (
        ("kafka", "(a) baseline: Spark's kafka source"),
        ("dataservice", "(b) dataservice, ARROW_IPC chunks"),
        ("ds-records", "(c) dataservice, readFormat records"),
    )
    for source, title in rows:
        print(f"  {title:<38} {best[source]:>10,.0f} / {median[source]:>10,.0f} rec/s")
    for source, name in (("dataservice", "(b)/(a)"), ("ds-records", "(c)/(a)")):
        print(f"  ratio {name} = best {best[source] / best['kafka']:.2f}, "
              f"median {median[source] / median['kafka']:.2f}  (aim >= 0.8)")  # fmt: skip
    print(f"  ARROW_IPC over records (b)/(c): best "
          f"{best['dataservice'] / best['ds-records']:.2f}, "
          f"median {median['dataservice'] / median['ds-records']:.2f}")  # fmt: skip
    print(f"  cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
