"""What every job shares: the Spark session, the source's options, command-line flags.

Jobs run locally by default (``local[*]``) and on a cluster with ``--master``. A local run
needs the Python workers to use this interpreter (its virtualenv holds pyarrow, grpc and
the project), so ``PYSPARK_PYTHON`` defaults to ``sys.executable``; on a cluster, ship the
project with ``--py-files`` and point ``PYSPARK_PYTHON`` at an interpreter that has the
``spark`` extra installed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from spark.sources import DataserviceDataSource


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """Flags that select what the ``dataservice`` source reads."""
    parser.add_argument(
        "--assigner",
        default=os.environ.get("DS_ASSIGNER", "127.0.0.1:7070"),
        help="assigner gRPC address(es), HOST:PORT[,HOST:PORT] (env DS_ASSIGNER)",
    )
    parser.add_argument("--consul", default=None, help="find the assigner leader in Consul")
    parser.add_argument("--group", required=True, help="consumer group whose sidecars to read")
    parser.add_argument("--topics", default="", help="comma-separated; default: the group's")


def add_spark_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument(
        "--shuffle-partitions", type=int, default=8, help="spark.sql.shuffle.partitions"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration, as spark-submit's --conf (repeatable)",
    )


def source_options(args: argparse.Namespace, **extra: Any) -> dict[str, str]:
    options = {"assigner": args.assigner, "group": args.group}
    if args.consul:
        options["consul"] = args.consul
    if args.topics:
        options["topics"] = args.topics
    options.update({k: str(v) for k, v in extra.items() if v is not None})
    return options


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--conf expects KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value
    return conf


def build_session(
    app_name: str,
    master: str | None,
    shuffle_partitions: int,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session with the ``dataservice`` source registered. ``master`` None keeps what
    spark-submit set, or local[*] when run with ``python -m``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Not under spark-submit (whose JVM starts us with its gateway's port and its own
        # --master): run locally.
        builder = builder.master("local[*]")
    settings = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        # Standard Parquet timestamps (UTC-adjusted micros), not the legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # How long the JVM waits for a new Python worker to connect back (default 15 s):
        # importing pyarrow and grpc on a busy small machine can take longer.
        "spark.python.authenticate.socketTimeout": "120s",
        # Python data sources return Arrow batches; keep Spark from re-chunking them.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("DS_SPARK_LOG_LEVEL", "WARN"))
    session.dataSource.register(DataserviceDataSource)
    return session


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # py4j logs every gateway call at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """An event set by SIGTERM (what ``dsctl dev down`` sends) or SIGINT. Jobs poll it and
    stop their queries themselves: the handler must not call into Spark, since the main
    thread may be inside a py4j call at that moment. A hard kill loses nothing either:
    the checkpoint is the source of truth."""
    event = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield event
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
