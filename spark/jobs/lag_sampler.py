"""The lag trend of the distribution job: a thread sampling the group's committed and end
offsets (DescribeGroup) every few seconds while the job runs, the samples of earlier runs
read back from lag.parquet, and their summary."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from services.runtime.topic_partition import TP
from spark.sources.mesh import AssignerClient, MeshError

log = logging.getLogger("spark.jobs.lag_sampler")


MAX_LAG_SAMPLES = 100_000


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
