"""Commits made from the event loop (issue 34, commit_completions.py and
OffsetCommitter.commit_async): which commits the loop makes itself, how their answers are
matched, and that a commit never reaches the consumer while a job of the commit thread
may be inside it. The consumer is a stand-in that answers like librdkafka (an asynchronous
commit's answer comes through ``on_commit`` at the next poll): pure logic, which way each
commit goes. The real commits are the e2e suites' (test_ack_binding_on_kafka and others)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.commit_completions import (
    FIRST_POLL_SECONDS,
    LAST_POLL_SECONDS,
    CommitCompletions,
    key_of,
    poll_delays,
)
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.runtime import commitmeta
from services.runtime.topic_partition import TP

T = TP("t", 0)
U = TP("t", 1)
EPOCH = 3


def tps(*offsets: tuple[TP, int]) -> list[TopicPartition]:
    return [TopicPartition(tp.topic, tp.partition, offset) for tp, offset in offsets]


# ---- matching answers (pure) ------------------------------------------------------------------


def test_an_answer_goes_to_the_commit_of_the_same_offsets() -> None:
    completions = CommitCompletions()
    first = completions.expect(tps((T, 10)))
    second = completions.expect(tps((T, 11), (U, 5)))
    completions.on_commit(None, tps((U, 5), (T, 11)))
    assert (first.answered, second.answered) == (False, True)
    assert key_of(second.result) == key_of(tps((T, 11), (U, 5)))
    assert completions.waiting == 1


def test_an_answer_nobody_waits_for_is_dropped() -> None:
    """librdkafka calls on_commit for the commit thread's synchronous commits too."""
    completions = CommitCompletions()
    pending = completions.expect(tps((T, 10)))
    completions.on_commit(None, tps((T, 9)))
    assert not pending.answered


def test_the_same_offsets_twice_are_answered_oldest_first() -> None:
    completions = CommitCompletions()
    first, second = completions.expect(tps((T, 10))), completions.expect(tps((T, 10)))
    completions.on_commit(None, tps((T, 10)))
    assert (first.answered, second.answered) == (True, False)
    completions.on_commit(None, tps((T, 10)))
    assert second.answered


def test_a_request_that_failed_whole_answers_the_oldest() -> None:
    completions = CommitCompletions()
    first, second = completions.expect(tps((T, 10))), completions.expect(tps((U, 1)))
    error = KafkaError(KafkaError._TRANSPORT)
    completions.on_commit(error, None)
    assert first.answered and first.error is error and not second.answered


def test_a_forgotten_commit_takes_no_answer() -> None:
    completions = CommitCompletions()
    gone = completions.expect(tps((T, 10)))
    kept = completions.expect(tps((T, 10)))
    completions.forget(gone)
    completions.on_commit(None, tps((T, 10)))
    assert kept.answered and not gone.answered


def test_the_polls_start_soon_and_slow_down_to_the_last() -> None:
    delays = list(itertools.islice(poll_delays(), 12))
    assert delays[0] == FIRST_POLL_SECONDS
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert delays[-1] == LAST_POLL_SECONDS


# ---- the committer's ways ----------------------------------------------------------------------


@dataclass
class Refused:
    """A partition of a commit's answer with its error, as librdkafka gives it."""

    topic: str
    partition: int
    offset: int
    error: KafkaError


class Consumer:
    """Answers like librdkafka: a synchronous commit returns its offsets; an asynchronous
    one is answered through on_commit at the next poll; OffsetFetch answers the last
    commit. ``inside`` is set while a call runs (the test holds ``hold`` to keep one in)."""

    def __init__(self, completions: CommitCompletions) -> None:
        self.completions = completions
        self.calls: list[tuple[str, threading.Thread]] = []
        self.unanswered: list[list[TopicPartition]] = []
        self.committed_last: dict[tuple[str, int], TopicPartition] = {}
        self.refuse: KafkaError | None = None
        self.hold = threading.Lock()
        self.inside = threading.Event()

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> object:
        self.calls.append(
            ("commit-async" if asynchronous else "commit", threading.current_thread())
        )
        for tp in offsets:
            self.committed_last[(tp.topic, tp.partition)] = tp
        if asynchronous:
            self.unanswered.append(offsets)
            return None
        return offsets

    def poll(self, timeout: float) -> None:
        self.calls.append(("poll", threading.current_thread()))
        answered, self.unanswered = self.unanswered, []
        for offsets in answered:
            if self.refuse is not None:  # TopicPartition.error is librdkafka's to set
                offsets = [
                    Refused(tp.topic, tp.partition, tp.offset, self.refuse) for tp in offsets
                ]  # type: ignore[misc]
            self.completions.on_commit(None, offsets)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.inside.set()
        with self.hold:
            self.calls.append(("committed", threading.current_thread()))
        self.inside.clear()
        return [
            self.committed_last.get(
                (tp.topic, tp.partition), TopicPartition(tp.topic, tp.partition, -1001)
            )
            for tp in partitions
        ]

    def close(self) -> None:
        pass


def committer(read_back_seconds: float = 60.0) -> tuple[OffsetCommitter, Consumer]:
    table = PartitionTable(1 << 26, time.monotonic)
    completions = CommitCompletions()
    consumer = Consumer(completions)
    commits = OffsetCommitter(
        table,
        sidecar_id="s",
        consumer=consumer,  # type: ignore[arg-type]
        external_check_seconds=read_back_seconds,
        completions=completions,
    )
    Fetcher(consumer, table, commits, batch=10, on_data=lambda: None)  # type: ignore[arg-type]
    now = table.clock()
    for tp in (T, U):
        table.add(Partition(tp=tp, epoch=EPOCH, deadline=now + 30, acks=PartitionAcks(0)))
    return commits, consumer


def on_loop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The test runs ``scenario`` on an event loop of its own."""

    @functools.wraps(scenario)
    def test() -> None:
        asyncio.run(scenario())

    return test


def kinds(consumer: Consumer) -> list[str]:
    return [kind for kind, _ in consumer.calls]


@on_loop
async def test_the_loop_commits_itself_and_takes_the_answer_at_its_poll() -> None:
    commits, consumer = committer()
    await commits.check_external_async([T, U])  # read back: nothing due for a while
    consumer.calls.clear()
    sent = await commits.commit_async([CommitRequest(T, 120, EPOCH, ((130, 140),))])
    assert [r.offset for r in sent] == [120]
    assert kinds(consumer) == ["commit-async", "poll"]
    assert all(thread is threading.main_thread() for _, thread in consumer.calls)
    meta = commitmeta.decode(consumer.committed_last[("t", 0)].metadata, 120)
    assert meta is not None and meta.epoch == EPOCH and meta.acked == ((130, 140),)
    commits.stop()


@on_loop
async def test_a_partition_due_to_be_read_back_commits_on_the_thread() -> None:
    commits, consumer = committer(read_back_seconds=0.0)
    await commits.commit_async([CommitRequest(T, 120, EPOCH)])
    assert kinds(consumer) == ["committed", "commit"]
    assert all(thread is not threading.main_thread() for _, thread in consumer.calls)
    commits.stop()


@on_loop
async def test_with_external_changes_ignored_nothing_is_read_back_and_the_loop_commits() -> None:
    commits, consumer = committer(read_back_seconds=0.0)
    commits.external_changes = "ignore"
    await commits.commit_async([CommitRequest(T, 120, EPOCH)])
    assert kinds(consumer) == ["commit-async", "poll"]
    commits.stop()


@on_loop
async def test_the_loop_never_calls_the_consumer_while_a_job_of_the_thread_may_be_inside() -> None:
    """confluent-kafka lets one thread at a time into a consumer: a loop that called it
    while a read-back waits for Kafka would stop the whole sidecar with it."""
    commits, consumer = committer()
    await commits.check_external_async([T, U])
    consumer.calls.clear()
    consumer.hold.acquire()
    reading = asyncio.ensure_future(commits.check_external_async([T]))
    while not consumer.inside.is_set():
        await asyncio.sleep(0.001)
    committing = asyncio.ensure_future(commits.commit_async([CommitRequest(T, 120, EPOCH)]))
    await asyncio.sleep(0.05)
    assert kinds(consumer) == [] and not committing.done()  # queued behind the read-back
    consumer.hold.release()
    await reading
    assert [r.offset for r in await committing] == [120]
    assert kinds(consumer) == ["committed", "commit"]  # in order, on the thread
    commits.stop()


@on_loop
async def test_an_answer_the_thread_polled_first_ends_the_loops_wait() -> None:
    """The fetch thread serves the commit consumer now and then (a poll on the commit
    thread): an answer it takes is the loop's commit's answer all the same."""
    commits, consumer = committer()
    await commits.check_external_async([T, U])
    committing = asyncio.ensure_future(commits.commit_async([CommitRequest(T, 120, EPOCH)]))
    await asyncio.sleep(0)
    commits.between_polls(commits._table.clock() + 10)  # serves it on the commit thread
    assert [r.offset for r in await committing] == [120]
    polls = [thread for kind, thread in consumer.calls if kind == "poll"]
    assert polls == [polls[0]] and polls[0] is not threading.main_thread()
    commits.stop()


@on_loop
async def test_a_partition_kafka_refused_fails_the_commit() -> None:
    commits, consumer = committer()
    await commits.check_external_async([T, U])
    consumer.refuse = KafkaError(KafkaError.NOT_COORDINATOR)
    with pytest.raises(KafkaException):
        await commits.commit_async([CommitRequest(T, 120, EPOCH)])
    commits.stop()


@on_loop
async def test_a_lease_that_lapsed_before_the_commit_is_not_committed_from_the_loop() -> None:
    commits, consumer = committer()
    await commits.check_external_async([T, U])
    consumer.calls.clear()
    part = commits._table.get(T)
    assert part is not None
    part.deadline = commits._table.clock() - 1
    assert await commits.commit_async([CommitRequest(T, 120, EPOCH)]) == []
    assert kinds(consumer) == []
    commits.stop()


@on_loop
async def test_a_stopped_committer_fails_the_commit_waiting_for_its_answer() -> None:
    commits, consumer = committer()
    await commits.check_external_async([T, U])
    consumer.poll = lambda timeout: None  # type: ignore[method-assign]  # never answered
    committing = asyncio.ensure_future(commits.commit_async([CommitRequest(T, 120, EPOCH)]))
    await asyncio.sleep(0.02)
    commits.stop()
    with pytest.raises(KafkaException):
        await committing
