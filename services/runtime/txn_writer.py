"""Writes to one topic that only the current term's writer can make: a transactional
producer under one fixed ``transactional.id`` (ARCHITECTURE §6, "Fenced state writes").

Every replica that may write (the assigner leader) uses the same ``transactional.id``.
Opening a term (:meth:`TransactionalWriter.open_term`) creates a fresh producer and calls
``init_transactions()``: the broker's transaction coordinator bumps the id's producer epoch,
aborts whatever transaction the previous holder left open, and from then on refuses every
write of the previous holder (``PRODUCER_FENCED`` / ``INVALID_PRODUCER_EPOCH``). So a
paused old leader that wakes up after a new one was elected cannot write a single record:
its next commit fails, ``on_lost`` runs, and it steps down at once. Readers use
``isolation.level=read_committed`` (librdkafka's default), so an aborted write is never
applied.

Writes are queued from the event loop (:meth:`produce`) and made on a thread of this
module: each round takes every write queued so far and makes them one transaction
(begin, produce, commit), so concurrent writes share a commit's round trips. A write's
future resolves with its records' offsets once the transaction committed, or fails with
:class:`Fenced`, :class:`NoTerm` (no term open: not the leader), the Kafka error (the
transaction was aborted: nothing of it was written), or TimeoutError after its timeout
(its transaction may still commit later; the caller treats it as not written).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.runtime.kafka import new_producer
from services.runtime.settings import ServiceSettings

log = structlog.get_logger(__name__)

# The errors that mean another producer with this transactional.id took over.
FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
ROUND_MAX_WRITES = 500  # writes folded into one transaction at most
INIT_TIMEOUT_SECONDS = 30.0


class Fenced(Exception):
    """Another writer opened a term under the same transactional.id: this one may not
    write any more (the broker refused it)."""


class NoTerm(Exception):
    """No term is open on this writer (it does not lead, or its term ended)."""


@dataclass
class _Write:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[int]]
    records: Sequence[tuple[bytes, bytes | None]]
    offsets: list[int] = field(default_factory=list)

    def settle(self, result: list[int] | None, error: BaseException | None) -> None:
        """From the writer thread: resolve or fail the future on its loop (once)."""

        def apply() -> None:
            if self.future.done():
                return  # timed out meanwhile
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result or [])

        self.loop.call_soon_threadsafe(apply)


def is_fenced(error: KafkaError) -> bool:
    return error.code() in FENCED_CODES


class TransactionalWriter:
    """See the module doc. ``on_lost`` (the term ended: fenced, or the producer failed
    fatally) is called on the writer thread: hand it over to the event loop."""

    def __init__(
        self,
        settings: ServiceSettings,
        topic: str,
        *,
        transactional_id: str,
        client_id: str,
        on_lost: Callable[[], None],
        overrides: Mapping[str, Any] | None = None,
        commit_timeout: float = 10.0,
    ) -> None:
        self.topic = topic
        self.transactional_id = transactional_id
        self._settings = settings
        self._client_id = client_id
        self._overrides = dict(overrides or {})
        self._on_lost = on_lost
        self._commit_timeout = commit_timeout
        self._producer: Producer | None = None
        self._lock = threading.Lock()  # guards _producer between the caller and the thread
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._closing = threading.Event()  # stops resuming a slow commit
        self._thread = threading.Thread(target=self._serve, name=f"{client_id}-txn", daemon=True)
        self._thread.start()

    # ---- terms (blocking: call through asyncio.to_thread) -------------------------------

    def open_term(self, timeout: float = INIT_TIMEOUT_SECONDS) -> None:
        """Take the transactional.id: fences every earlier writer and aborts its open
        transaction. KafkaException when the coordinator cannot be reached in time."""
        producer = new_producer(
            self._settings,
            client_id=self._client_id,
            overrides={
                **self._overrides,
                "transactional.id": self.transactional_id,
                # A transaction left open by a writer that died is aborted by the broker
                # after this; the next term's init_transactions aborts it at once anyway.
                "transaction.timeout.ms": 60_000,
            },
        )
        producer.init_transactions(timeout)
        with self._lock:
            self._producer = producer
        log.info("state writes: term opened", transactional_id=self.transactional_id)

    def close_term(self) -> None:
        """Stop writing (stepping down): queued and later writes fail with NoTerm."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(1.0)

    # ---- writes (on the event loop) -----------------------------------------------------

    def produce(
        self, records: Sequence[tuple[bytes, bytes | None]], *, timeout: float
    ) -> asyncio.Future[list[int]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[int]] = loop.create_future()

        def expire() -> None:
            if not future.done():
                future.set_exception(
                    TimeoutError(f"topic {self.topic}: not committed within {timeout:g}s")
                )

        handle = loop.call_later(timeout, expire)
        future.add_done_callback(lambda _f: handle.cancel())
        self._queue.put(_Write(loop, future, records))
        return future

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout=self._commit_timeout + 5)
        self.close_term()

    # ---- the writer thread --------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            writes = [first]
            while len(writes) < ROUND_MAX_WRITES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this round
                    break
                writes.append(more)
            writes = [w for w in writes if not w.future.done()]  # timed out while queued
            if writes:
                self._round(writes)

    def _round(self, writes: list[_Write]) -> None:
        with self._lock:
            producer = self._producer
        if producer is None:
            for write in writes:
                write.settle(None, NoTerm(f"no term open on {self.transactional_id}"))
            return
        try:
            self._transaction(producer, writes)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if is_fenced(error):
                self._fenced(producer, writes, error)
                return
            self._abort(producer, error)
            for write in writes:
                write.settle(None, exc)
            return
        for write in writes:
            write.settle(write.offsets, None)

    def _transaction(self, producer: Producer, writes: list[_Write]) -> None:
        producer.begin_transaction()
        for write in writes:
            write.offsets = [-1] * len(write.records)
            for index, (key, value) in enumerate(write.records):
                producer.produce(
                    self.topic, key=key, value=value, on_delivery=_offset_into(write, index)
                )
        # Flushes (serving the delivery reports) and commits; raises on any failure.
        self._commit(producer)

    def _commit(self, producer: Producer) -> None:
        """``commit_transaction``, resumed while it fails with a retriable error: a slow or
        failing-over transaction coordinator (librdkafka: "retry call to resume"). Aborting
        instead is refused while the commit is unfinished, which ended the term: a broker
        paused past the commit timeout made the assigner stop leading for good (found by
        the chaos suite). The writes waiting on it time out by themselves meanwhile and are
        taken back by their callers; a commit that completes later only burns their epochs.
        Any other error is raised: the caller aborts, or ends the term if it is fatal."""
        warned = False
        while True:
            try:
                producer.commit_transaction(self._commit_timeout)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable() or error.txn_requires_abort() or self._closing.is_set():
                    raise
                if not warned:
                    log.warning(
                        "state write commit slow; resuming it",
                        transactional_id=self.transactional_id,
                        error=error.str(),
                    )
                    warned = True

    def _fenced(self, producer: Producer, writes: list[_Write], error: KafkaError) -> None:
        log.error(
            "state writes fenced: another writer took the transactional id",
            transactional_id=self.transactional_id,
            error=error.str(),
        )
        for write in writes:
            write.settle(None, Fenced(error.str()))
        self._end(producer)

    def _abort(self, producer: Producer, error: KafkaError) -> None:
        """A failed transaction: abort it, so nothing of it is ever read. A producer that
        cannot abort (a fatal error, or fenced meanwhile) ends the term like a fence: the
        owner steps down, and opens a new term only if it is elected again (reopening it
        here could fence a newer leader)."""
        log.warning(
            "state write transaction failed; aborting",
            transactional_id=self.transactional_id,
            error=error.str(),
        )
        while not error.fatal():
            try:
                producer.abort_transaction(self._commit_timeout)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or self._closing.is_set():
                    break  # resumed like a commit while the abort is only slow
        log.error("state writes: the term cannot go on", error=error.str())
        self._end(producer)

    def _end(self, producer: Producer) -> None:
        with self._lock:
            if self._producer is producer:
                self._producer = None
        self._on_lost()


def _offset_into(write: _Write, index: int) -> Callable[[KafkaError | None, Message], None]:
    def report(error: KafkaError | None, message: Message) -> None:
        if error is None:
            write.offsets[index] = int(message.offset() or 0)

    return report
