"""Helpers of the Spark tests: produce events, run a job as its own process (so it can be
killed with SIGKILL like a crashed driver), and read a file sink's output the way Spark
does — through the sink's log (``_spark_metadata``), which lists only committed files."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
from confluent_kafka import KafkaError, Message, Producer

from tests.support import waiting

REPO = Path(__file__).resolve().parents[2]
EVENT_BASE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KINDS = ("view", "click", "buy")
# Spark settings for tests on a small shared machine.
SPARK_FLAGS = (
    "--master", "local[2]", "--shuffle-partitions", "4",
    "--conf", "spark.ui.enabled=false",
    "--conf", "spark.sql.streaming.fileSink.log.compactInterval=5",
)  # fmt: skip


def event(i: int) -> dict[str, object]:
    """Event ``i``: event time 5 ms apart, three kinds, 97 users."""
    ts = EVENT_BASE + dt.timedelta(milliseconds=5 * i)
    return {
        "id": i,
        "user": f"u{i % 97}",
        "kind": KINDS[i % 3],
        "amount": (i % 100) / 10,
        "ts": ts.isoformat().replace("+00:00", "Z"),
    }


def produce_events(bootstrap: str, topic: str, count: int, partitions: int) -> set[int]:
    """Produce events 0..count-1 round-robin over the partitions; the ids Kafka confirmed."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    confirmed: set[int] = set()
    failures: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            confirmed.add(int(msg.key() or b"-1"))

    for i in range(count):
        while True:
            try:
                producer.produce(
                    topic,
                    key=str(i).encode(),
                    value=json.dumps(event(i)).encode(),
                    partition=i % partitions,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "records left unconfirmed"
    assert not failures, failures[:3]
    return confirmed


class SparkJob:
    """``python -m spark.jobs.<name> ARGS`` in its own process group, output in a log."""

    def __init__(self, name: str, args: Sequence[str], log: Path) -> None:
        self.argv = [sys.executable, "-m", f"spark.jobs.{name}", *args]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SparkJob:
        # Spark's scratch space under the test's directory: a killed driver leaves it behind.
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_DIRS": str(self.log.parent / "spark-local"),
        }
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=REPO, env=env, start_new_session=True,
            )  # fmt: skip
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole job at once: the Python driver, its JVM and Python workers."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM the driver alone (its handler stops the queries, then Spark; a SIGTERM to
        the JVM as well would race it with Spark's shutdown hook), then SIGKILL the rest."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        # The JVM and workers share the group: make sure none outlives the driver.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def tail(self, lines: int = 80) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(line for line in text.splitlines() if "WARN" not in line)[-8000:]


def committed_batches(checkpoint: Path) -> set[int]:
    """Batch ids in a query checkpoint's commit log (finished batches)."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return set()
    return {int(p.name) for p in commits.iterdir() if p.name.isdigit()}


def sink_files(sink: Path) -> list[Path]:
    """The files a file sink committed, from its log: the latest compaction plus the
    batches after it. Files a killed batch left behind are not in the log."""
    log_dir = sink / "_spark_metadata"
    if not log_dir.is_dir():
        return []
    batches: dict[int, Path] = {}
    for entry in log_dir.iterdir():
        if entry.name.startswith("."):
            continue
        stem = entry.name.removesuffix(".compact")
        if stem.isdigit():
            batches[int(stem)] = entry
    compacted = [b for b, p in batches.items() if p.name.endswith(".compact")]
    first = max(compacted, default=0)
    files: dict[str, bool] = {}
    for batch in sorted(b for b in batches if b >= first):
        lines = batches[batch].read_text().splitlines()
        assert lines and lines[0] == "v1", f"unknown sink log format in {batches[batch]}"
        for line in lines[1:]:
            entry = json.loads(line)
            files[entry["path"]] = entry["action"] == "add"
    return sorted(Path(unquote(urlparse(p).path)) for p, added in files.items() if added)


def read_sink(sink: Path, columns: Sequence[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for path in sink_files(sink):
        rows.extend(pq.read_table(path, columns=list(columns)).to_pylist())
    return rows


def count_sink(sink: Path) -> int:
    return sum(pq.ParquetFile(path).metadata.num_rows for path in sink_files(sink))


def wait_for(what: str, check: Callable[[], bool], timeout: float, job: SparkJob) -> None:
    """The shared :func:`tests.support.waiting.wait_for`, failing at once if the job exits,
    and showing the job's log tail either way."""

    def done() -> bool:
        if check():
            return True
        if not job.running():
            raise AssertionError(f"{what}: the job exited {job.proc and job.proc.returncode}:\n"
                                 f"{job.tail()}")  # fmt: skip
        return False

    waiting.wait_for(done, timeout, what, every=0.5, detail=job.tail)
