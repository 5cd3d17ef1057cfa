"""TransactionalWriter's commit under a slow transaction coordinator (pure: a fake producer
that behaves as librdkafka's transactional API documents).

Found by the chaos suite's scenario 6 (the broker leading the state topic paused 12 s): the
commit timed out with a *retriable* error, the writer aborted instead of resuming it, the
abort was refused ("Conflicting commit_transaction API call is already in progress") and
the assigner stopped leading for good. librdkafka: a retriable commit error means "call
commit_transaction again to resume"; only an error that requires abort is aborted, and
only a fatal one ends the producer.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from services.runtime.settings import ServiceSettings
from services.runtime.txn_writer import TransactionalWriter


class SlowCoordinator:
    """commit_transaction times out ``timeouts`` times (retriable), then succeeds; an abort
    while a commit is unfinished is refused, as librdkafka refuses it."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.commit_pending = False
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, *, key: bytes, value: bytes | None, on_delivery: Any) -> None:
        self.calls.append("produce")
        self._deliver = on_delivery

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        if self.timeouts > 0:
            self.timeouts -= 1
            self.commit_pending = True
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    "Timed out waiting for operation to finish, retry call to resume",
                    retriable=True,
                )
            )
        self.commit_pending = False

        class Delivered:
            def offset(self) -> int:
                return 7

        self._deliver(None, Delivered())

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        if self.commit_pending:
            raise KafkaException(
                KafkaError(
                    KafkaError._CONFLICT,
                    "Conflicting commit_transaction API call is already in progress",
                )
            )

    def flush(self, timeout: float) -> int:
        return 0


def write_once(coordinator: SlowCoordinator) -> tuple[object, bool]:
    lost = threading.Event()
    writer = TransactionalWriter(
        ServiceSettings(),
        "__state",
        transactional_id="t",
        client_id="test",
        on_lost=lost.set,
        commit_timeout=0.01,
    )
    writer._producer = coordinator  # type: ignore[assignment]  # a term is open

    async def write() -> object:
        try:
            return await writer.produce([(b"k", b"v")], timeout=5)
        except Exception as exc:  # the outcome is what the test looks at
            return exc

    try:
        outcome = asyncio.run(write())
    finally:
        writer.close()
    return outcome, lost.is_set()


def test_a_commit_that_times_out_is_resumed_and_the_term_goes_on() -> None:
    coordinator = SlowCoordinator(timeouts=3)
    outcome, lost = write_once(coordinator)
    assert outcome == [7]
    assert not lost, "a slow coordinator must not end the term"
    assert coordinator.calls == ["begin", "produce", "commit", "commit", "commit", "commit"]


def test_a_commit_on_time_needs_no_retry() -> None:
    coordinator = SlowCoordinator(timeouts=0)
    assert write_once(coordinator) == ([7], False)
