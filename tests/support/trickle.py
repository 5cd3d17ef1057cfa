"""A slow producer and a wait for commits, for the tests that read at the low rates services
run (about 100 records/s): tests/e2e/test_stream_answers_real.py and
tests/e2e/test_fetch_carried_acks_real.py."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from tests.support.sidecar_rpcs import PARTITIONS
from tests.support.walking_skeleton import committed_offsets, end_offsets

RECORDS = 400
RATE = 100.0  # records per second


def trickle(bootstrap: str, topic: str) -> threading.Thread:
    """Produce RECORDS keyed by sequence, round robin over the partitions, one by one at
    about RATE (each sent alone: linger.ms 0), on a thread."""

    def run() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        for seq in range(RECORDS):
            producer.produce(
                topic, key=str(seq).encode(), value=b"v" * 100, partition=seq % PARTITIONS
            )
            producer.poll(0)
            time.sleep(1 / RATE)
        assert producer.flush(30) == 0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def settled(bootstrap: str, group: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    ends = end_offsets(bootstrap, topic)
    deadline = time.monotonic() + 15
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        committed = committed_offsets(bootstrap, group, topic)
        if committed == ends:
            break
        time.sleep(0.5)
    return committed, ends
