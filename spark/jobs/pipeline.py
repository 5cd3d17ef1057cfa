"""Example pipeline: JSON events from the mesh → Parquet, exactly once; windowed aggregates.

    python -m spark.jobs.pipeline --assigner 127.0.0.1:7070 --group orders \\
        --output /data/orders --checkpoint /data/orders-checkpoint [--master local[2]]
    spark-submit spark/jobs/pipeline.py --group orders --output ... --checkpoint ...

Two streaming queries, each with its own checkpoint:

1. **events** — the ``dataservice`` source (the group's topics, values parsed as JSON with
   :data:`EVENT_SCHEMA`; a malformed value gives null fields, its topic/partition/offset
   kept) → Parquet in ``OUTPUT/events``. The source's offsets and the file sink's log live
   in ``CHECKPOINT/events``: after any crash (``kill -9`` included) a restart re-runs the
   unfinished batch over exactly the same offset ranges and the sink's log keeps only one
   copy of its files, so every record is in the output exactly once. Finished batches'
   offsets are committed to the consumer group through the sidecars.
2. **windows** — reads ``OUTPUT/events`` as a stream (only files committed by the sink's
   log), aggregates per event-time window and ``kind`` with a watermark (count, sum of
   ``amount``, distinct users) → Parquet in ``OUTPUT/windows``, append mode: a window is
   written once, when the watermark passes its end, and never again.

``--available-now`` processes what is there and exits (events first, then windows);
otherwise both run until SIGTERM. A line per finished batch goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from spark.jobs.common import (
    add_source_args,
    add_spark_args,
    build_session,
    configure_logging,
    parse_conf,
    source_options,
    stop_requested,
)

log = logging.getLogger("spark.jobs.pipeline")

EVENT_SCHEMA = "id BIGINT, user STRING, kind STRING, amount DOUBLE, ts TIMESTAMP"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark.jobs.pipeline", description=__doc__.split("\n")[0]
    )
    add_source_args(parser)
    add_spark_args(parser)
    parser.add_argument("--output", required=True, type=Path, help="OUTPUT/{events,windows}")
    parser.add_argument("--checkpoint", required=True, type=Path, help="CHECKPOINT/{events,...}")
    parser.add_argument("--starting-offsets", default="committed")
    parser.add_argument("--max-records-per-trigger", type=int, default=None)
    parser.add_argument("--window", default="1 minute", help="event-time window length")
    parser.add_argument("--watermark", default="2 minutes", help="allowed event lateness")
    parser.add_argument("--trigger-seconds", type=float, default=0.0, help="0 = back to back")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then exit"
    )
    return parser.parse_args(argv)


def events_frame(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    raw = (
        spark.readStream.format("dataservice")
        .options(
            **source_options(
                args,
                startingOffsets=args.starting_offsets,
                maxRecordsPerTrigger=args.max_records_per_trigger,
                valueFormat="json",
                valueSchema=EVENT_SCHEMA,
            )
        )
        .load()
    )
    return raw.select(
        "value.*",
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
    )


def windows_frame(
    spark: SparkSession, events_dir: Path, schema: StructType, args: argparse.Namespace
) -> DataFrame:
    events = spark.readStream.schema(schema).parquet(str(events_dir))
    return (
        events.where(F.col("ts").isNotNull())
        .withWatermark("ts", args.watermark)
        .groupBy(F.window("ts", args.window), F.col("kind"))
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.sum("amount").alias("amount"),
            F.approx_count_distinct("user").alias("users"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "kind",
            "events",
            "amount",
            "users",
        )
    )


def start_sink(
    frame: DataFrame, name: str, output: Path, checkpoint: Path, args: argparse.Namespace
) -> StreamingQuery:
    writer = (
        frame.writeStream.queryName(name)
        .format("parquet")
        .outputMode("append")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    elif args.trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    return writer.start()


def wait_for_sink_log(query: StreamingQuery, events_dir: Path, stop: threading.Event) -> None:
    """The windows query reads the events sink's output through the sink's log (only
    committed files), but a file stream source looks for that log once, when it starts:
    start it only after the events sink has committed a batch."""
    while query.isActive and not stop.is_set():
        if (events_dir / "_spark_metadata").is_dir():
            return
        stop.wait(0.5)


def report_progress(queries: Sequence[StreamingQuery], seen: dict[str, int]) -> None:
    for query in queries:
        for progress in query.recentProgress:
            batch = int(progress["batchId"])
            if seen.get(query.name or "", -1) >= batch:
                continue
            seen[query.name or ""] = batch
            rows = progress.get("numInputRows", 0)
            if rows:
                end = progress["sources"][0].get("endOffset") if progress["sources"] else None
                log.info("%s batch %d: %d rows, end %s", query.name, batch, rows, end)


def run(args: argparse.Namespace) -> int:
    spark = build_session(
        "dataservice-pipeline", args.master, args.shuffle_partitions, parse_conf(args.conf)
    )
    events_dir = args.output / "events"
    windows_dir = args.output / "windows"
    events_dir.mkdir(parents=True, exist_ok=True)  # the windows query's file source needs it
    seen: dict[str, int] = {}
    with stop_requested() as stop:
        events = events_frame(spark, args)
        events_query = start_sink(events, "events", events_dir, args.checkpoint / "events", args)
        if args.available_now:
            events_query.awaitTermination()
            report_progress([events_query], seen)
        else:
            wait_for_sink_log(events_query, events_dir, stop)
        queries = [events_query]
        if not stop.is_set():
            queries.append(
                start_sink(
                    windows_frame(spark, events_dir, events.schema, args),
                    "windows",
                    windows_dir,
                    args.checkpoint / "windows",
                    args,
                )
            )
        while any(q.isActive for q in queries) and not stop.is_set():
            report_progress(queries, seen)
            if any(not q.isActive and q.exception() is not None for q in queries):
                break
            stop.wait(0.5)
        for query in queries:
            query.stop()
        report_progress(queries, seen)
        failed = [q for q in queries if q.exception() is not None]
        for query in failed:
            log.error("query %s failed: %s", query.name, query.exception())
    spark.stop()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
