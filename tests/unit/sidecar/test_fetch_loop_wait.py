"""How much the fetch loop asks consume() for (Fetcher._run), without Kafka.

librdkafka's consume(num, timeout) returns once it has ``num`` records or the timeout
passed. Idle (nothing for BUSY_SECONDS), the loop waits POLL_TIMEOUT_SECONDS per call, so
asking for a whole batch held the first record that arrived for up to that long
(bench_sidecar.py --rows d --lat-rate 0.5: +24-37 ms at p50 over a direct consumer, +0.5-2.4
after). Idle it asks for one record; busy, for a whole batch."""

from __future__ import annotations

import threading
import time

from services.consumer_sidecar.fetcher import (
    BUSY_POLL_TIMEOUT_SECONDS,
    POLL_TIMEOUT_SECONDS,
    Fetcher,
)
from services.consumer_sidecar.partitions import PartitionTable

BATCH = 5000


class RecordingConsumer:
    """consume() returns nothing after a short sleep and records what it was asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []
        self.lock = threading.Lock()

    def consume(self, num: int, timeout: float) -> list[object]:
        with self.lock:
            self.calls.append((num, timeout))
        time.sleep(0.001)
        return []

    def close(self) -> None:
        pass

    def taken(self) -> list[tuple[int, float]]:
        with self.lock:
            calls, self.calls = self.calls, []
        return calls


def test_idle_asks_for_one_record_and_busy_for_a_batch() -> None:
    consumer = RecordingConsumer()
    table = PartitionTable(1 << 20, time.monotonic)
    fetcher = Fetcher(
        consumer,  # type: ignore[arg-type]
        table,
        sidecar_id="s",
        batch=BATCH,
        on_data=lambda: None,
    )
    fetcher.start()
    try:
        time.sleep(0.2)
        idle = consumer.taken()
        assert idle
        assert set(idle) == {(1, POLL_TIMEOUT_SECONDS)}
        fetcher.call(lambda: None).result(timeout=5)  # a command: busy for BUSY_SECONDS
        time.sleep(0.1)
        busy = consumer.taken()
        assert (BATCH, BUSY_POLL_TIMEOUT_SECONDS) in busy
        assert (1, POLL_TIMEOUT_SECONDS) not in busy[1:]  # the first may predate the command
    finally:
        fetcher.stop()
