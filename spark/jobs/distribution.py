"""Distribution and lag analytics of a group's topics, read through the mesh's sidecars.

    python -m spark.jobs.distribution --assigner 127.0.0.1:7070 --group demo --output out/
    spark-submit spark/jobs/distribution.py --group demo --output out/ [--every 60]

Reads the group's topics with the ``dataservice`` batch reader (``startingOffsets``
earliest by default, up to the end offsets; a batch read commits nothing, so the group's
own progress is untouched) and computes, per topic, partition and key:

* records and bytes (key + value) in total, and records/s and bytes/s over event-time
  windows (``--window``) per partition and for the top keys;
* key skew: the top keys with their share, the Gini coefficient over all keys' counts
  (computed in Spark with a window function) and max/mean;
* partition skew: records per partition, max/mean, Gini, coefficient of variation;
* the lag trend: the group's committed and end offsets (``DescribeGroup``) sampled every
  ``--lag-interval`` seconds while the job runs, appended to the samples of earlier runs.

Writes to ``--output``: ``keys/`` (Parquet, every key), ``partitions.parquet``,
``rates.parquet``, ``key_rates.parquet``, ``lag.parquet``, ``summary.json`` (every figure
above), PNG plots in ``plots/`` and ``report.html`` showing them. ``--every S`` repeats the
analysis every S seconds (what ``dsctl dev up --spark-distribution`` runs) until SIGTERM.

This module is the job's command line and loop; the analysis is in
:mod:`spark.jobs.distribution_analysis`, the lag sampler in :mod:`spark.jobs.lag_sampler`,
the plots and report.html in :mod:`spark.jobs.distribution_plots`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark.jobs.common import (
    add_source_args,
    add_spark_args,
    build_session,
    configure_logging,
    parse_conf,
    stop_requested,
)
from spark.jobs.distribution_analysis import analyse, write_rows
from spark.jobs.distribution_plots import plot_all, write_report
from spark.jobs.lag_sampler import LagSampler, lag_summary, load_lag_history
from spark.sources.mesh import AssignerClient

log = logging.getLogger("spark.jobs.distribution")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark.jobs.distribution", description=__doc__.split("\n")[0]
    )
    add_source_args(parser)
    add_spark_args(parser)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--ending-offsets", default="latest")
    parser.add_argument("--window", type=int, default=10, help="rate window, seconds")
    parser.add_argument("--top-keys", type=int, default=10)
    parser.add_argument("--lag-interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--every", type=float, default=0.0, help="repeat every S seconds")
    return parser.parse_args(argv)


# ---- lag sampling -------------------------------------------------------------------


# ---- analysis -----------------------------------------------------------------------


# ---- report -------------------------------------------------------------------------


# ---- main ---------------------------------------------------------------------------


def run_once(spark: SparkSession, args: argparse.Namespace, sampler: LagSampler) -> dict[str, Any]:
    started = time.monotonic()
    summary = analyse(spark, args)
    sampler.sample()
    lag_rows = sampler.snapshot()
    write_rows(args.output / "lag.parquet", lag_rows)
    summary["group"] = args.group
    summary["generated_at"] = dt.datetime.now(dt.UTC).isoformat()
    summary["window_seconds"] = args.window
    summary["lag"] = lag_summary(lag_rows)
    plots = plot_all(args.output, summary, lag_rows)
    summary["plots"] = [f"plots/{p}" for p in plots]
    tmp = args.output / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(args.output / "summary.json")
    report = write_report(args.output, summary, plots)
    log.info("report written to %s in %.1f s", report, time.monotonic() - started)
    return summary


def run(args: argparse.Namespace) -> int:
    args.output.mkdir(parents=True, exist_ok=True)
    spark = build_session(
        "dataservice-distribution", args.master, args.shuffle_partitions, parse_conf(args.conf)
    )
    assigner = AssignerClient(args.assigner.split(","), args.consul)
    sampler = LagSampler(assigner, args.group, args.lag_interval)
    sampler.rows.extend(load_lag_history(args.output / "lag.parquet"))
    sampler.start()
    try:
        with stop_requested() as stop:
            while not stop.is_set():
                run_once(spark, args, sampler)
                if args.every <= 0:
                    break
                stop.wait(args.every)
    finally:
        sampler.stop()
        assigner.close()
    spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
