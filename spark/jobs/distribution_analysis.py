"""The distribution job's analysis, in Spark: the group's records read through the mesh
(the dataservice batch reader), and per topic, partition and key the records, bytes,
event-time rates and skew (summary.json's figures; the Parquet tables beside it)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark.jobs.common import (
    source_options,
)
from spark.jobs.skew import skew_of

NULL_KEY = "<null>"


def records_frame(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    raw = (
        spark.read.format("dataservice")
        .options(
            **source_options(
                args,
                startingOffsets=args.starting_offsets,
                endingOffsets=args.ending_offsets,
                keyFormat="utf8",
            )
        )
        .load()
    )
    return raw.select(
        "topic",
        "partition",
        F.coalesce(F.col("key"), F.lit(NULL_KEY)).alias("key"),
        (
            F.coalesce(F.octet_length("key"), F.lit(0))
            + F.coalesce(F.octet_length("value"), F.lit(0))
        ).alias("bytes"),
        "timestamp",
    )


def _seconds(first: dt.datetime | None, last: dt.datetime | None, floor: float) -> float:
    """The span a rate is taken over: first to last record, at least one window."""
    if first is None or last is None:
        return floor
    return max((last - first).total_seconds(), floor)


def analyse(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    records = records_frame(spark, args).persist()
    try:
        return _analyse(records, args)
    finally:
        records.unpersist()


def _analyse(records: DataFrame, args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.output
    window = float(args.window)
    # Partitions.
    partition_rows = [
        r.asDict()
        for r in records.groupBy("topic", "partition")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.sum("bytes").alias("bytes"),
            F.min("timestamp").alias("first"),
            F.max("timestamp").alias("last"),
        )
        .orderBy("topic", "partition")
        .collect()
    ]
    for row in partition_rows:
        span = _seconds(row["first"], row["last"], window)
        row["records_per_s"] = row["records"] / span
        row["bytes_per_s"] = row["bytes"] / span
    write_rows(out / "partitions.parquet", partition_rows)

    # Keys: every key's counts, then per topic the Gini over them (ascending rank i:
    # G = 2·Σ i·x / (n·Σ x) - (n+1)/n, as spark.jobs.skew.gini) and the top keys.
    keys = records.groupBy("topic", "key").agg(
        F.count(F.lit(1)).alias("records"),
        F.sum("bytes").alias("bytes"),
        F.min("timestamp").alias("first"),
        F.max("timestamp").alias("last"),
    )
    keys.write.mode("overwrite").parquet(str(out / "keys"))
    keys = keys.sparkSession.read.parquet(str(out / "keys"))  # computed once, read back
    ranked = keys.withColumn(
        "rank_up", F.row_number().over(Window.partitionBy("topic").orderBy("records", "key"))
    )
    key_skew = {
        r["topic"]: r.asDict()
        for r in ranked.groupBy("topic")
        .agg(
            F.count(F.lit(1)).alias("keys"),
            F.sum("records").alias("records"),
            F.sum("bytes").alias("bytes"),
            F.max("records").alias("max_records"),
            F.sum(F.col("rank_up") * F.col("records")).alias("weighted"),
        )
        .collect()
    }
    top_window = Window.partitionBy("topic").orderBy(F.desc("records"), "key")
    top_rows = [
        r.asDict()
        for r in keys.withColumn("rank", F.row_number().over(top_window))
        .where(F.col("rank") <= args.top_keys)
        .orderBy("topic", "rank")
        .collect()
    ]

    # Rates over event-time windows: per partition, and per top key.
    duration = f"{args.window} seconds"
    rate_rows = [
        {
            "window_start": r["w"]["start"],
            "topic": r["topic"],
            "partition": r["partition"],
            "records": r["records"],
            "bytes": r["bytes"],
            "records_per_s": r["records"] / window,
            "bytes_per_s": r["bytes"] / window,
        }
        for r in records.where(F.col("timestamp").isNotNull())
        .groupBy(F.window("timestamp", duration).alias("w"), "topic", "partition")
        .agg(F.count(F.lit(1)).alias("records"), F.sum("bytes").alias("bytes"))
        .orderBy("w", "topic", "partition")
        .collect()
    ]
    write_rows(out / "rates.parquet", rate_rows)
    top_pairs = [(r["topic"], r["key"]) for r in top_rows]
    key_rate_rows: list[dict[str, Any]] = []
    if top_pairs:
        wanted = F.struct("topic", "key").isin([F.struct(F.lit(t), F.lit(k)) for t, k in top_pairs])
        key_rate_rows = [
            {
                "window_start": r["w"]["start"],
                "topic": r["topic"],
                "key": r["key"],
                "records": r["records"],
                "bytes": r["bytes"],
                "records_per_s": r["records"] / window,
                "bytes_per_s": r["bytes"] / window,
            }
            for r in records.where(F.col("timestamp").isNotNull() & wanted)
            .groupBy(F.window("timestamp", duration).alias("w"), "topic", "key")
            .agg(F.count(F.lit(1)).alias("records"), F.sum("bytes").alias("bytes"))
            .orderBy("w", "topic", "key")
            .collect()
        ]
    write_rows(out / "key_rates.parquet", key_rate_rows)
    return summarise(partition_rows, key_skew, top_rows, window)


def summarise(
    partition_rows: Sequence[Mapping[str, Any]],
    key_skew: Mapping[str, Mapping[str, Any]],
    top_rows: Sequence[Mapping[str, Any]],
    window: float,
) -> dict[str, Any]:
    topics: dict[str, Any] = {}
    for topic in sorted({r["topic"] for r in partition_rows} | set(key_skew)):
        parts = [r for r in partition_rows if r["topic"] == topic]
        counts = {int(r["partition"]): int(r["records"]) for r in parts}
        partition_skew = skew_of(counts)
        ks = key_skew.get(topic, {})
        n = int(ks.get("keys", 0))
        total = int(ks.get("records", 0))
        key_gini = 2.0 * ks["weighted"] / (n * total) - (n + 1) / n if n and total else 0.0
        first = min((r["first"] for r in parts if r["first"] is not None), default=None)
        last = max((r["last"] for r in parts if r["last"] is not None), default=None)
        span = _seconds(first, last, window)
        topics[topic] = {
            "records": total,
            "bytes": int(ks.get("bytes", 0)),
            "records_per_s": total / span,
            "bytes_per_s": int(ks.get("bytes", 0)) / span,
            "first_timestamp": first.isoformat() if first else None,
            "last_timestamp": last.isoformat() if last else None,
            "keys": {
                "distinct": n,
                "gini": key_gini,
                "max_over_mean": (ks["max_records"] / (total / n)) if n and total else 0.0,
                "top": [
                    {
                        "key": r["key"],
                        "records": int(r["records"]),
                        "bytes": int(r["bytes"]),
                        "share": int(r["records"]) / total if total else 0.0,
                    }
                    for r in top_rows
                    if r["topic"] == topic
                ],
            },
            "partitions": {
                "records": {str(p): c for p, c in sorted(counts.items())},
                **partition_skew.as_dict(),
            },
        }
    return {"topics": topics}


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows)) if rows else pa.table({})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
