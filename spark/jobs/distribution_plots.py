"""The distribution job's pictures: PNG plots of the key and partition distribution, the rates
and the lag trend, and report.html showing them with the summary's figures (matplotlib,
files only)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display

import matplotlib.pyplot as plt
import pyarrow.parquet as pq


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
