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
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from services.runtime.topic_partition import TP
from spark.jobs.common import (
    add_source_args,
    add_spark_args,
    build_session,
    configure_logging,
    parse_conf,
    source_options,
    stop_requested,
)
from spark.jobs.skew import skew_of
from spark.sources.mesh import AssignerClient, MeshError

log = logging.getLogger("spark.jobs.distribution")

NULL_KEY = "<null>"
MAX_LAG_SAMPLES = 100_000


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


@dataclass
class LagSampler:
    """Samples the group's committed and end offsets on a background thread."""

    assigner: AssignerClient
    group: str
    interval: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        try:
            view = self.assigner.describe(self.group, timeout=10)
        except MeshError as exc:
            log.warning("lag sample failed: %s", exc)
            return
        now = dt.datetime.now(dt.UTC)
        with self._lock:
            for (topic, partition), end in sorted(view.ends.items()):
                committed = view.committed.get(TP(topic, partition), -1)
                self.rows.append(
                    {
                        "sampled_at": now,
                        "topic": topic,
                        "partition": partition,
                        "committed": committed,
                        "end": end,
                        "lag": end - max(committed, 0),
                    }
                )
            del self.rows[:-MAX_LAG_SAMPLES]

    def start(self) -> LagSampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="lag-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.sample()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.rows)


def load_lag_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    try:
        return list(pq.read_table(path).to_pylist())
    except (OSError, pa.ArrowInvalid) as exc:
        log.warning("ignoring unreadable lag history %s: %s", path, exc)
        return []


# ---- analysis -----------------------------------------------------------------------


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
    _write_rows(out / "partitions.parquet", partition_rows)

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
    _write_rows(out / "rates.parquet", rate_rows)
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
    _write_rows(out / "key_rates.parquet", key_rate_rows)
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


def _write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows)) if rows else pa.table({})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


# ---- report -------------------------------------------------------------------------


def lag_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {"samples": 0}
    last_at = max(r["sampled_at"] for r in rows)
    latest = [r for r in rows if r["sampled_at"] == last_at]
    by_time: dict[Any, int] = {}
    for r in rows:
        by_time[r["sampled_at"]] = by_time.get(r["sampled_at"], 0) + int(r["lag"])
    return {
        "samples": len(by_time),
        "latest_at": last_at.isoformat(),
        "total_lag": sum(int(r["lag"]) for r in latest),
        "partitions": {
            f"{r['topic']}[{r['partition']}]": {
                "committed": int(r["committed"]),
                "end": int(r["end"]),
                "lag": int(r["lag"]),
            }
            for r in sorted(latest, key=lambda r: (r["topic"], r["partition"]))
        },
        "trend": [{"at": t.isoformat(), "total_lag": lag} for t, lag in sorted(by_time.items())],
    }


def plot_all(
    out: Path, summary: Mapping[str, Any], lag_rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    """PNG plots into ``out/plots``; returns the file names made."""
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    made = []
    if summary["topics"]:
        plot_distribution(plots / "distribution.png", summary["topics"])
        made.append("distribution.png")
    rates_file = out / "rates.parquet"
    rates = pq.read_table(rates_file).to_pylist() if rates_file.exists() else []
    if rates:
        plot_rates(plots / "rates.png", rates)
        made.append("rates.png")
    if lag_rows:
        plot_lag(plots / "lag.png", lag_rows)
        made.append("lag.png")
    return made


def plot_distribution(path: Path, topics: Mapping[str, Any]) -> None:
    """Per topic: records per partition, and the top keys' shares."""
    fig, axes = plt.subplots(len(topics), 2, figsize=(12, 3.5 * len(topics)), squeeze=False)
    for row, (topic, info) in enumerate(sorted(topics.items())):
        parts = info["partitions"]["records"]
        left = axes[row][0]
        left.bar([int(p) for p in parts], list(parts.values()), color="#4c72b0")
        left.set_title(
            f"{topic}: records per partition (max/mean {info['partitions']['max_over_mean']:.2f})"
        )
        left.set_xlabel("partition")
        left.set_ylabel("records")
        top = list(reversed(info["keys"]["top"]))
        right = axes[row][1]
        right.barh([str(k["key"])[:30] for k in top], [k["share"] for k in top])
        right.set_title(f"{topic}: top keys by share (Gini {info['keys']['gini']:.3f})")
        right.set_xlabel("share of records")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_rates(path: Path, rates: Sequence[Mapping[str, Any]]) -> None:
    """Records/s per topic over the event-time windows."""
    series: dict[str, dict[Any, float]] = {}
    for r in rates:
        line = series.setdefault(r["topic"], {})
        line[r["window_start"]] = line.get(r["window_start"], 0.0) + float(r["records_per_s"])
    fig, ax = plt.subplots(figsize=(12, 4))
    for topic, points in sorted(series.items()):
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker=".", label=topic)
    ax.set_title("records/s per topic over event-time windows")
    ax.set_ylabel("records/s")
    ax.legend(loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_lag(path: Path, lag_rows: Sequence[Mapping[str, Any]]) -> None:
    """The group's total lag over the samples, and each partition's (up to 24)."""
    per_partition: dict[str, dict[Any, int]] = {}
    for r in lag_rows:
        name = f"{r['topic']}[{r['partition']}]"
        per_partition.setdefault(name, {})[r["sampled_at"]] = int(r["lag"])
    totals: dict[Any, int] = {}
    for samples in per_partition.values():
        for at, lag in samples.items():
            totals[at] = totals.get(at, 0) + lag
    fig, ax = plt.subplots(figsize=(12, 4))
    xs = sorted(totals)
    ax.plot(xs, [totals[x] for x in xs], color="black", linewidth=2, label="total")
    if len(per_partition) <= 24:
        for name, samples in sorted(per_partition.items()):
            px = sorted(samples)
            ax.plot(px, [samples[x] for x in px], linewidth=0.8, label=name)
    ax.set_title("group lag (records) over time")
    ax.set_ylabel("lag")
    ax.legend(loc="upper left", fontsize=6, ncol=4)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, summary: Mapping[str, Any], plots: Sequence[str]) -> Path:
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>dataservice distribution: {esc(summary['group'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "th{background:#eee}</style></head><body>",
        f"<h1>Group <code>{esc(summary['group'])}</code></h1>",
        f"<p>generated {esc(summary['generated_at'])}</p>",
        "<h2>Topics</h2><table><tr><th>topic</th><th>records</th><th>bytes</th>"
        "<th>records/s</th><th>keys</th><th>top key</th><th>top share</th>"
        "<th>key Gini</th><th>key max/mean</th><th>partition max/mean</th>"
        "<th>partition Gini</th></tr>",
    ]
    for topic, info in sorted(summary["topics"].items()):
        top = info["keys"]["top"][0] if info["keys"]["top"] else {"key": "", "share": 0.0}
        parts.append(
            f"<tr><td>{esc(topic)}</td><td>{info['records']}</td><td>{info['bytes']}</td>"
            f"<td>{info['records_per_s']:.1f}</td><td>{info['keys']['distinct']}</td>"
            f"<td>{esc(str(top['key']))}</td><td>{top['share']:.3f}</td>"
            f"<td>{info['keys']['gini']:.3f}</td><td>{info['keys']['max_over_mean']:.2f}</td>"
            f"<td>{info['partitions']['max_over_mean']:.2f}</td>"
            f"<td>{info['partitions']['gini']:.3f}</td></tr>"
        )
    parts.append("</table>")
    for topic, info in sorted(summary["topics"].items()):
        parts.append(f"<h3>{esc(topic)}: top keys</h3><table><tr><th>key</th><th>records</th>")
        parts.append("<th>share</th></tr>")
        for key in info["keys"]["top"]:
            parts.append(
                f"<tr><td>{esc(str(key['key']))}</td><td>{key['records']}</td>"
                f"<td>{key['share']:.3f}</td></tr>"
            )
        parts.append("</table>")
    lag = summary["lag"]
    parts.append(f"<h2>Lag</h2><p>{lag['samples']} samples; latest total lag ")
    parts.append(f"{lag.get('total_lag', 'n/a')}</p><table><tr><th>partition</th>")
    parts.append("<th>committed</th><th>end</th><th>lag</th></tr>")
    for name, p in lag.get("partitions", {}).items():
        parts.append(
            f"<tr><td>{esc(name)}</td><td>{p['committed']}</td><td>{p['end']}</td>"
            f"<td>{p['lag']}</td></tr>"
        )
    parts.append("</table><h2>Plots</h2>")
    for name in plots:
        parts.append(f"<p><img src='plots/{esc(name)}' alt='{esc(name)}'></p>")
    parts.append("</body></html>")
    path = out / "report.html"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(parts), encoding="utf-8")
    tmp.replace(path)
    return path


# ---- main ---------------------------------------------------------------------------


def run_once(spark: SparkSession, args: argparse.Namespace, sampler: LagSampler) -> dict[str, Any]:
    started = time.monotonic()
    summary = analyse(spark, args)
    sampler.sample()
    lag_rows = sampler.snapshot()
    _write_rows(args.output / "lag.parquet", lag_rows)
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
