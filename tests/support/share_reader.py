"""``bench_pod_cost``'s share-group reader: Kafka's own per-record delivery (KIP-932).

A share group gives what the sidecar gives an application (records handed out under an
acquisition lock, acknowledged one by one, redelivered with a count), at the cost of a Kafka
client, so it is the baseline the issue asks for beside the direct consumers. confluent-kafka
has no share consumer yet; the Java client does (``KafkaShareConsumer``), and the Java
``dsread`` runs it: ``dsread --share --stamped`` subscribes to the topic, acknowledges each
batch with ``commitSync()`` and prints ``lat SEQ MS`` per record, the latency from the
``seq:time_ns:`` stamp in its value. It runs until SIGTERM, then prints its ``done`` line.

Not a Python process: its CPU, RSS and wake-ups are the JVM's (``java -jar``), measured from
``/proc`` as every other reader's.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import IO

from tests.support.pod_readers import Arrivals
from tests.support.readers import REPO

DSREAD_JAR = REPO / "clients/java/target/dsread.jar"
RUN_UNTIL_STOPPED = 10**15  # --expect: never reached; the bench stops it with SIGTERM


def share_command(bootstrap: str, topic: str, group: str) -> list[str]:
    """The JVM's command line; raises with what to run when the jar or java is missing."""
    if not DSREAD_JAR.exists():
        raise RuntimeError(f"{DSREAD_JAR} is missing: run `make client-java` first")
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(
            "java is not on PATH: Java 17 or later (scripts/setup.sh lists the tools)"
        )
    return [
        java, "-jar", str(DSREAD_JAR), "--share", "--stamped",
        "--bootstrap", bootstrap, "--topic", topic, "--group", group,
        "--expect", str(RUN_UNTIL_STOPPED), "--idle-exit-s", "3600",
    ]  # fmt: skip


def start(
    bootstrap: str, topic: str, group: str, out: IO[bytes], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """The share reader, its ``lat`` lines to ``out`` (a file: never a pipe nobody reads)."""
    return subprocess.Popen(share_command(bootstrap, topic, group), stdout=out, stderr=log)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM (the reader acknowledges what it holds and prints ``done``), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def has_received(path: Path) -> bool:
    """Whether the reader has printed a record's latency yet (it is reading)."""
    with path.open("rb") as f:
        return any(line.startswith(b"lat ") for line in f)


def arrivals(lines: list[str]) -> Arrivals:
    """What the reader saw, from its output: first-arrival latency by seq, the duplicates
    (a record delivered again, with a higher delivery count), and an error when it never
    printed its ``done`` line."""
    got = Arrivals()
    done = False
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "lat":
            seq, ms = int(parts[1]), float(parts[2])
            if seq in got.first_ms:
                got.duplicates += 1
            else:
                got.first_ms[seq] = ms
        elif parts and parts[0] == "done":
            done = True
    if not done:
        got.error = "the share reader ended without its done line"
    return got
