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
issue's aim is ≥ 0.8. Beside each run, the CPU it cost per record in each process of the
benchmark's tree (user + system, reaped children included, ``psutil``): Spark's JVM, its
Python workers (the executors' ``pyspark.daemon`` and the driver's streaming source
runner), the sidecars, the broker; on 2 shared cores the sum is what bounds records/s.
Never asserts a time (CONVENTIONS "Tests"). Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import dataclasses
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

import psutil
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


# Process tree categories for the CPU split, by command line; the first match wins.
CATEGORIES = (
    ("py-workers", ("pyspark.daemon", "pyspark.worker", "python_streaming_source_runner")),
    ("sidecars", ("services.consumer_sidecar",)),
    ("assigner", ("services.assigner",)),
    ("broker", ("kafka.Kafka",)),
    ("spark-jvm", ("org.apache.spark",)),
)


def _category(proc: psutil.Process) -> str:
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:  # exited meanwhile (a zombie): its parent tells
        return "py-workers" if _under_spark(proc) else "other"
    for name, needles in CATEGORIES:
        if any(n in cmdline for n in needles):
            return name
    return "bench" if proc.pid == os.getpid() else "other"


def _under_spark(proc: psutil.Process) -> bool:
    try:
        return any("org.apache.spark" in " ".join(p.cmdline()) for p in proc.parents())
    except psutil.Error:
        return False


def cpu_by_category() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants, by category. A process's
    reaped children count with it (a Python worker that exited counts with its daemon),
    except the JVM's: its children are Spark's Python workers."""
    me = psutil.Process()
    totals: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        name = _category(proc)
        reaped = "py-workers" if name == "spark-jvm" else name
        totals[name] = totals.get(name, 0.0) + t.user + t.system
        totals[reaped] = totals.get(reaped, 0.0) + t.children_user + t.children_system
    return totals


@dataclass(frozen=True)
class Run:
    source: str
    records: int
    seconds: float
    cpu: dict[str, float]  # CPU seconds of the run by category (see CATEGORIES)

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def timed_query(spark: SparkSession, name: str, frame: DataFrame, checkpoint: Path) -> Run:
    cpu_before = cpu_by_category()
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
    cpu_after = cpu_by_category()
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()}
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")
    progress = query.recentProgress
    rows = sum(int(p["numInputRows"]) for p in progress)
    if os.environ.get("BENCH_VERBOSE"):
        for p in progress:
            print(f"  {name} batch {p['batchId']}: {p['numInputRows']} rows {p['durationMs']}")
    return Run(name, rows, seconds, cpu)


def cpu_line(run: Run) -> str:
    """µs of CPU per record by category, largest first, and the total."""
    per = {k: v * 1e6 / max(run.records, 1) for k, v in run.cpu.items() if v > 0.005}
    parts = [f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])]
    return f"cpu µs/record: {', '.join(parts)}; total {sum(per.values()):.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use a running Kafka instead of starting one")
    parser.add_argument("--rounds", type=int, help="rounds instead of the profile's (1 / 3)")
    args = parser.parse_args()
    profile = SHORT if args.short else FULL
    if args.rounds is not None:
        profile = dataclasses.replace(profile, rounds=max(args.rounds, 1))
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
                  f"({run.records:,} in {run.seconds:.2f} s) load "
                  f"{os.getloadavg()[0]:.1f}; {cpu_line(run)}")  # fmt: skip
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
    print("  CPU per record, median of rounds (µs; user + system of each process tree part):")
    for source, _title in rows:
        runs_of = [r for r in runs if r.source == source]
        names = sorted({k for r in runs_of for k in r.cpu})
        per = {
            k: statistics.median(r.cpu.get(k, 0.0) * 1e6 / max(r.records, 1) for r in runs_of)
            for k in names
        }
        shown = ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.05
        )
        print(f"    {source:<12} total {sum(per.values()):5.1f}: {shown}")
    print(f"  cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
