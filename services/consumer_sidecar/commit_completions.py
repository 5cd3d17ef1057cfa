"""Commits made from the event loop, and how their answers come back (issue 34).

Leased mode's commits went to the commit thread and back: the thread woke for each, waited
for Kafka's answer in a synchronous ``commit()``, and its end woke the event loop again.
At the rates services run that round trip is dearer than the commit itself: measured on
real Kafka at 100 commits a second, ten wake-ups and about 460 µs of CPU per commit that
way, against five and 185 µs when the loop hands librdkafka an asynchronous commit and
takes its answer with ``poll(0)`` on its own timer (docs/benchmarks/pod-cost.md, the
twenty-first pass). librdkafka sends the commit from its own threads either way.

An asynchronous commit's answer is librdkafka's offset-commit callback (the consumer's
``on_commit``), run inside a ``poll()`` of the commit consumer: by the loop's timer
(:func:`poll_delays`) while a commit waits, or by whichever thread polls it first.
:class:`CommitCompletions` matches each answer to the commit that waits for it by what it
committed; an answer nobody waits for (a synchronous commit's: librdkafka calls the
callback for those too) is dropped. Pure logic: no Kafka, no event loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, TopicPartition

# The first look for an answer, then twice as long each time up to the last: on the same
# host a commit is answered in about a millisecond (one look), across a network in a few.
FIRST_POLL_SECONDS = 0.002
LAST_POLL_SECONDS = 0.05

Key = frozenset[tuple[str, int, int]]


def key_of(offsets: Sequence[TopicPartition]) -> Key:
    """What a commit committed: (topic, partition, offset) of each partition."""
    return frozenset((str(tp.topic), int(tp.partition or 0), int(tp.offset)) for tp in offsets)


@dataclass(eq=False)
class PendingCommit:
    """A commit handed to librdkafka, until its answer: ``error`` (the whole request
    failed) or ``result`` (each partition, with its own error or None)."""

    key: Key
    answered: bool = False
    error: KafkaError | None = None
    result: list[TopicPartition] = field(default_factory=list)


class CommitCompletions:
    """The commits waiting for their answer, oldest first."""

    def __init__(self) -> None:
        self._pending: list[PendingCommit] = []

    def expect(self, offsets: Sequence[TopicPartition]) -> PendingCommit:
        """A commit of ``offsets`` is about to be handed to librdkafka."""
        pending = PendingCommit(key_of(offsets))
        self._pending.append(pending)
        return pending

    def forget(self, pending: PendingCommit) -> None:
        """The commit's waiter is done with it (answered, or it gave up waiting)."""
        if pending in self._pending:
            self._pending.remove(pending)

    @property
    def waiting(self) -> int:
        return sum(1 for p in self._pending if not p.answered)

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition] | None) -> None:
        """librdkafka's offset-commit callback (``on_commit`` in the consumer's config): the
        oldest unanswered commit of the same offsets takes the answer. Committing the
        same offsets twice, each answer goes to one of them; they are the same commit. An
        answer that names no partition (a request that failed whole) goes to the oldest:
        librdkafka answers commits in the order they were made."""
        key = key_of(partitions or [])
        # A copy: the loop adds and removes while a poll on another thread may call this.
        for pending in list(self._pending):
            if not pending.answered and (pending.key == key or not key):
                pending.answered = True
                pending.error = error
                pending.result = list(partitions or [])
                return


def poll_delays() -> Iterator[float]:
    """How long to wait before each look for an answer: FIRST_POLL_SECONDS, doubling, then
    LAST_POLL_SECONDS for as long as it takes (librdkafka answers every commit, with an
    error when the request times out)."""
    delay = FIRST_POLL_SECONDS
    while True:
        yield delay
        delay = min(delay * 2, LAST_POLL_SECONDS)
