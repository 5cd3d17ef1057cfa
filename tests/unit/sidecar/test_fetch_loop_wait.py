"""How the fetch loop waits for records (Fetcher._run), without Kafka.

librdkafka's consume(num, timeout) returns once it has ``num`` records or the timeout
passed: asking it for a whole batch with a timeout holds the first record that arrives
until the batch fills or the timeout ends. Idle (POLL_TIMEOUT_SECONDS a call) that held a
record for up to 50 ms (bench_sidecar.py --rows d --lat-rate 0.5: +24-37 ms at p50 over a
direct consumer); busy (BUSY_POLL_TIMEOUT_SECONDS) for up to 2 ms, on every record of a
stream of 1,000 records/s. So the loop waits only for the first record, with poll(), which
returns as it arrives, and then takes what else librdkafka has queued with consume(num, 0),
which never waits."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

import pytest
from confluent_kafka import Message

from services.consumer_sidecar import poll_timing
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.poll_timing import (
    BUSY_POLL_TIMEOUT_SECONDS,
    IDLE_POLL_TIMEOUT_SECONDS,
    POLL_TIMEOUT_SECONDS,
    poll_timeout,
)

BATCH = 5000


class RecordingConsumer:
    """poll() waits a little and returns a record while ``flowing``; consume() returns
    what is "queued" at once. Both record what they were asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []
        self.lock = threading.Lock()
        self.flowing = threading.Event()
        self.offset = 0

    def _record(self) -> Message:
        self.offset += 1
        return Message(topic="t", partition=0, offset=self.offset, value=b"v", timestamp=(1, 1))

    def poll(self, timeout: float) -> Message | None:
        with self.lock:
            self.calls.append(("poll", 1, timeout))
        time.sleep(0.001)
        return self._record() if self.flowing.is_set() else None

    def consume(self, num: int, timeout: float) -> list[Message]:
        with self.lock:
            self.calls.append(("consume", num, timeout))
        return [self._record() for _ in range(3)] if self.flowing.is_set() else []

    def close(self) -> None:
        pass

    def taken(self) -> list[tuple[str, int, float]]:
        with self.lock:
            calls, self.calls = self.calls, []
        return calls


def test_the_loop_waits_for_the_first_record_only_and_then_takes_what_is_queued() -> None:
    consumer = RecordingConsumer()
    table = PartitionTable(1 << 20, time.monotonic)
    fetcher = Fetcher(
        consumer,  # type: ignore[arg-type]
        table,
        OffsetCommitter(table, sidecar_id="s"),
        batch=BATCH,
        on_data=lambda: None,
    )
    fetcher.start()
    try:
        time.sleep(0.2)
        idle = consumer.taken()
        assert idle
        assert set(idle) == {("poll", 1, POLL_TIMEOUT_SECONDS)}  # nothing came: no consume()
        consumer.flowing.set()  # records flow: busy from the first one on
        time.sleep(0.1)
        busy = consumer.taken()
        assert ("poll", 1, BUSY_POLL_TIMEOUT_SECONDS) in busy
        # Every consume() follows a poll() that returned a record, and never waits.
        assert {c for c in busy if c[0] == "consume"} == {("consume", BATCH - 1, 0)}
        for before, call in pairwise(busy):
            if call[0] == "consume":
                assert before[0] == "poll"
    finally:
        fetcher.stop()


def leased_fetcher(consumer: RecordingConsumer) -> Fetcher:
    """Leased mode as the sidecar runs it: commits go through a commit consumer of their own."""
    table = PartitionTable(1 << 20, time.monotonic)
    return Fetcher(
        consumer,  # type: ignore[arg-type]
        table,
        OffsetCommitter(table, sidecar_id="s", consumer=RecordingConsumer()),  # type: ignore[arg-type]
        batch=BATCH,
        on_data=lambda: None,
    )


def test_leased_records_do_not_make_the_loop_poll_on_a_short_timeout() -> None:
    """Issue 34: a record ends the poll() as it arrives, so a short timeout after records
    only served commits made on this thread; in leased mode they go through the commit
    consumer, and busy polling (every 2 ms for a second after each record) kept a sidecar
    at 100 records/s waking 500 times a second for nothing."""
    consumer = RecordingConsumer()
    fetcher = leased_fetcher(consumer)
    fetcher.start()
    try:
        consumer.flowing.set()
        time.sleep(0.1)
        flowing = consumer.taken()
        assert any(c[0] == "consume" for c in flowing)  # records were taken
        assert {c for c in flowing if c[0] == "poll"} == {("poll", 1, POLL_TIMEOUT_SECONDS)}
    finally:
        fetcher.stop()


def test_a_command_makes_the_loop_busy_so_the_next_one_waits_little() -> None:
    consumer = RecordingConsumer()
    fetcher = leased_fetcher(consumer)
    fetcher.start()
    try:
        time.sleep(0.1)
        assert {c for c in consumer.taken() if c[0] == "poll"} == {
            ("poll", 1, POLL_TIMEOUT_SECONDS)
        }
        assert fetcher.call(lambda: 42).result(timeout=5) == 42
        time.sleep(0.1)
        assert ("poll", 1, BUSY_POLL_TIMEOUT_SECONDS) in consumer.taken()
    finally:
        fetcher.stop()


def test_poll_timeout_short_while_busy_long_once_quiet() -> None:
    assert poll_timeout(10.0, busy_until=10.5, quiet_at=14.0) == BUSY_POLL_TIMEOUT_SECONDS
    assert poll_timeout(10.0, busy_until=9.0, quiet_at=14.0) == POLL_TIMEOUT_SECONDS
    assert poll_timeout(15.0, busy_until=9.0, quiet_at=14.0) == IDLE_POLL_TIMEOUT_SECONDS
    assert IDLE_POLL_TIMEOUT_SECONDS > POLL_TIMEOUT_SECONDS > BUSY_POLL_TIMEOUT_SECONDS


def test_a_quiet_loop_polls_on_the_long_timeout_until_a_record_or_a_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34: an idle sidecar's fetch loop woke 20 times a second (50 ms polls); once
    nothing happened for QUIET_SECONDS it polls on IDLE_POLL_TIMEOUT_SECONDS, and a
    command or a record makes it active again."""
    monkeypatch.setattr(poll_timing, "QUIET_SECONDS", 0.05)
    consumer = RecordingConsumer()
    fetcher = leased_fetcher(consumer)
    fetcher.start()
    try:
        deadline = time.monotonic() + 10
        while ("poll", 1, IDLE_POLL_TIMEOUT_SECONDS) not in consumer.taken():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert fetcher.call(lambda: 42).result(timeout=5) == 42  # waits out one idle poll
        time.sleep(0.02)
        assert ("poll", 1, BUSY_POLL_TIMEOUT_SECONDS) in consumer.taken()
        consumer.flowing.set()
        time.sleep(0.1)
        assert ("poll", 1, IDLE_POLL_TIMEOUT_SECONDS) not in consumer.taken()[-3:]
    finally:
        fetcher.stop()
