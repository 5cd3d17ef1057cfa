"""Benchmarks as data: each benchmark writes its latest result to
``docs/benchmarks/results/<bench>.json``, and the site's benchmark pages render those files
(scripts/mkdocs_hooks.py). The convention, every key but ``results`` filled in here:

    {"bench": "balancer", "title": "...", "date": "2026-12-01T23:50:00Z",
     "command": "python tests/bench/bench_balancer.py --short", "commit": "799e04a",
     "summary": "one sentence: what was compared with what",
     "machine": {"cpus": 2, "cpu": "...", "python": "3.11.2", "platform": "...",
                 "load_average": [0.5, 0.4, 0.3]},
     "load": {... what the benchmark ran: sizes, rates, rounds ...},
     "results": [{"scenario": ..., "ours": ..., "baseline": ..., "ratio": ...}, ...]}

``results`` may also be an object of several named lists (a table each). Ratios are ours
over the baseline measured in the same run; CPU per record, when measured, is a column.

A benchmark whose file keeps several runs side by side (pod_cost.json: before and after a
change, A/B in one window) writes with a ``label``: its tables are named
``"<label>: <table> (<when>)"``, a run under a label already in the file replaces that run's
tables, and the other runs' tables stay (:func:`merge_labelled`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "benchmarks" / "results"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, CPU, Python, and how busy the machine was."""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []
    return {
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "load_average": load,
    }


def write_result(
    bench: str,
    *,
    title: str,
    summary: str,
    load: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    argv: Sequence[str] | None = None,
    out_dir: Path = RESULTS,
    label: str | None = None,
    when: str | None = None,
) -> Path:
    """Write ``<out_dir>/<bench>.json`` and return its path: without ``label`` replacing the
    previous result, with one (``results`` named tables then) replacing only the run of that
    label and keeping the file's other runs (:func:`merge_labelled`; ``when``: the run's
    start, by default now)."""
    args = sys.argv if argv is None else argv
    script = Path(args[0])
    shown = (
        script.relative_to(REPO) if script.is_absolute() and script.is_relative_to(REPO) else script
    )
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data: dict[str, Any] = {
        "bench": bench,
        "title": title,
        "summary": summary,
        "date": date,
        "command": shlex.join(["python", str(shown), *args[1:]]),
        "commit": _commit(),
        "machine": machine(),
        "load": dict(load),
        "results": results,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{bench}.json"
    if label is not None:
        if not isinstance(results, Mapping):
            raise ValueError("a labelled run's results are named tables")
        previous = json.loads(path.read_text()) if path.exists() else None
        data = merge_labelled(previous, data, label, when or date)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _of_label(table: str, label: str) -> bool:
    """Whether ``table`` (``"<label>: <name> (<when>)"``) is a table of ``label``'s run; a
    label may itself hold ": " (``"A/B: main"``), a table name does not."""
    return table.startswith(f"{label}: ") and ": " not in table[len(label) + 2 :]


def merge_labelled(
    previous: Mapping[str, Any] | None, new: Mapping[str, Any], label: str, when: str
) -> dict[str, Any]:
    """``new`` (one run, ``results`` its named tables) as the file's newest labelled run:
    its tables renamed ``"<label>: <table> (<when>)"`` first, then ``previous``'s tables but
    those of a run of the same label. The other keys are the new run's. A ``previous`` of
    another bench, or whose results are not named tables, is not kept."""
    tables = {f"{label}: {name} ({when})": rows for name, rows in new["results"].items()}
    kept = previous is not None and previous.get("bench") == new["bench"]
    earlier = previous.get("results") if previous is not None and kept else None
    if isinstance(earlier, Mapping):
        tables.update({k: v for k, v in earlier.items() if not _of_label(k, label)})
    return {**new, "results": tables}
