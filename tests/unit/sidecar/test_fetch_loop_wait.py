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

import asyncio
import math
import threading
import time
from collections.abc import Callable
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
    QUIET_SECONDS,
    park_seconds,
    poll_timeout,
)
from services.consumer_sidecar.serving import DataSignal

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


def leased_fetcher(
    consumer: RecordingConsumer, last_read: Callable[[], float] | None = None
) -> Fetcher:
    """Leased mode as the sidecar runs it: commits go through a commit consumer of their own.
    ``last_read``: when somebody last read (None: a reader always, the loop never parks)."""
    table = PartitionTable(1 << 20, time.monotonic)
    return Fetcher(
        consumer,  # type: ignore[arg-type]
        table,
        OffsetCommitter(table, sidecar_id="s", consumer=RecordingConsumer()),  # type: ignore[arg-type]
        batch=BATCH,
        on_data=lambda: None,
        last_read=last_read,
    )


def wait_for_call(
    consumer: RecordingConsumer, wanted: Callable[[tuple[str, int, float]], bool]
) -> list[tuple[str, int, float]]:
    """The calls up to and including the first ``wanted`` one (10 s at most)."""
    seen: list[tuple[str, int, float]] = []
    deadline = time.monotonic() + 10
    while True:
        for call in consumer.taken():
            seen.append(call)
            if wanted(call):
                return seen
        assert time.monotonic() < deadline, seen[-5:]
        time.sleep(0.01)


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


def test_park_only_when_nobody_read_for_a_while_and_no_command_came_lately() -> None:
    """Issue 34 item 3: a sidecar nobody reads from waits on its wake-up event, not in
    poll(); never while a Stream is open (last read: inf), a Fetch came within
    QUIET_SECONDS, or a command within BUSY_SECONDS; at most half the stall limit."""
    assert park_seconds(100.0, busy_until=0.0, read_at=math.inf, stall_limit=1.0) is None
    assert (
        park_seconds(100.0, busy_until=0.0, read_at=100.0 - QUIET_SECONDS / 2, stall_limit=1.0)
        is None
    )
    assert park_seconds(100.0, busy_until=100.5, read_at=-math.inf, stall_limit=1.0) is None
    assert park_seconds(100.0, busy_until=0.0, read_at=-math.inf, stall_limit=1.0) == 0.5
    assert park_seconds(100.0, busy_until=0.0, read_at=90.0, stall_limit=math.inf) == 0.5
    assert park_seconds(100.0, busy_until=0.0, read_at=90.0, stall_limit=0.4) == 0.2


def test_a_loop_nobody_reads_from_parks_takes_commands_at_once_and_wakes_for_a_reader() -> None:
    """Parked, the loop calls poll() only without waiting (what librdkafka fetched meanwhile,
    and its callbacks): a command is run without waiting for a poll() in progress, and a
    reader (a Stream opened) has it poll for records again."""
    read_at = [-math.inf]
    consumer = RecordingConsumer()
    fetcher = leased_fetcher(consumer, last_read=lambda: read_at[0])
    fetcher.start()
    try:
        parked = wait_for_call(consumer, lambda c: c == ("poll", 1, 0.0))
        parked += wait_for_call(consumer, lambda c: c == ("poll", 1, 0.0))
        assert set(parked) == {("poll", 1, 0.0)}  # no poll() waited for records
        # The command (run on the fetch thread) came between polls that did not wait.
        before = fetcher.call(consumer.taken).result(timeout=5)
        assert {c[2] for c in before if c[0] == "poll"} <= {0.0}
        # A command makes the loop busy: it polls (a grant's first records come as they
        # are fetched), then parks again.
        wait_for_call(consumer, lambda c: c == ("poll", 1, BUSY_POLL_TIMEOUT_SECONDS))
        wait_for_call(consumer, lambda c: c == ("poll", 1, 0.0))
        consumer.flowing.set()  # records fetched while parked are taken
        wait_for_call(consumer, lambda c: c == ("consume", BATCH - 1, 0))
        consumer.flowing.clear()
        read_at[0] = math.inf  # a Stream opened
        fetcher.reader_came()
        polling = wait_for_call(consumer, lambda c: c[0] == "poll" and c[2] > 0)
        assert polling[-1][2] in (POLL_TIMEOUT_SECONDS, IDLE_POLL_TIMEOUT_SECONDS)
    finally:
        fetcher.stop()


def test_the_data_signal_says_when_somebody_last_read() -> None:
    """A Fetch reads at the moment it comes; a Stream for as long as it is open. Both tell
    the fetch loop (on_read), which polls again if it was parked."""

    async def scenario() -> None:
        now = [50.0]
        signal = DataSignal(clock=lambda: now[0])
        told: list[str] = []
        signal.on_read = lambda: told.append("read")
        assert signal.last_read() == -math.inf
        signal.read()
        assert signal.last_read() == 50.0
        waiter = asyncio.Event()
        signal.add_waiter(waiter)
        now[0] = 80.0
        assert signal.last_read() == math.inf
        signal.drop(waiter)
        assert signal.last_read() == 80.0
        assert told == ["read", "read"]

    asyncio.run(scenario())
