"""Commits fenced by Kafka itself: one transactional producer per held lease (issue 36,
ARCHITECTURE §6.1; the group setting ``commit_fencing: kafka``).

The argument. Every lease (group, topic, partition) has one ``transactional.id``,
:func:`transactional_id`. A sidecar that is granted the lease creates a producer under
that id and calls ``init_transactions()`` *before* it reads the offset it starts from
(:meth:`FencedCommitter.open`, called through ``OffsetCommitter.open_leases`` by
``Fetcher.assign`` before its ``committed()``).
The broker's transaction coordinator then bumps the id's producer epoch, aborts whatever
transaction the previous holder had open (its offsets are never applied), and refuses
every later request of the previous holder's producer (``PRODUCER_FENCED`` /
``INVALID_PRODUCER_EPOCH``; librdkafka raises ``_FENCED``, fatal). Every commit of the
lease is a transaction of that producer: ``begin_transaction``,
``send_offsets_to_transaction(offsets, group metadata)``, ``commit_transaction``. So:

1. at any moment at most one producer can commit a partition's offset: the one that
   initialised the id last;
2. that producer read the committed offset *after* its initialisation, so after the last
   commit any earlier holder could make; every commit it makes follows from what it read
   plus what it delivered and had acked;
3. hence no commit can land behind the next holder, whatever the clocks, pauses (SIGSTOP,
   a VM stall, a GC) or network delays: a zombie's commit fails at the broker. This needs
   no deadline, which is what lets a lease outlive the assigner's absence (leasing.py).

Facts this rests on, checked against the shared Kafka 4 broker
(``docs/operate/failure-model.md`` has the script and its output): a ``TxnOffsetCommit``
with an ``assign()``-only consumer's group metadata (generation -1, no member id) is
accepted for a group with no members (a leased group never has any, ARCHITECTURE §10);
the offset and its metadata are then what ``committed()`` and
``list_consumer_group_offsets`` return; a second producer's ``init_transactions`` fences
the first, whose open transaction is aborted and whose next ``commit_transaction`` fails
with ``_FENCED`` ("This instance has been fenced by a newer instance").

Never initialise an id except on a grant. A holder that re-initialised its id later (after
a lost producer, lazily on its first commit) would fence the rightful holder and commit
from an offset it read while not holding the lease. So a producer that is fenced or left
unusable (a fatal error, a transaction that can neither commit nor abort) ends the lease
here (:class:`LeaseFenced`); the lease keeper drops the partition and reports it released;
only a new grant opens the id again.

Cost: a producer is a librdkafka instance (its own threads: measured +4 threads and about
0.4-0.8 MiB RSS per producer against one broker; more brokers, more threads), made once
per grant, and its creation with ``init_transactions`` takes 5-15 ms warm (up to 1.5 s
the first, cold), since it connects eagerly (``enable.sparse.connections`` off, below). A commit
costs AddOffsetsToTxn + TxnOffsetCommit + EndTxn instead of one OffsetCommit; with
librdkafka's default ``retry.backoff.ms`` (100) a transaction begun right after the
previous one's EndTxn waits for CONCURRENT_TRANSACTIONS retries (p50 110 ms back to back),
hence the short backoff below (p50 about 5 ms). Commits of several partitions run in
parallel, each its own transaction. Commit coalescing (lease_commits.py) is unchanged.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from services.runtime import commitmeta
from services.runtime.topic_partition import TP
from services.runtime.txn_writer import FENCED_CODES

log = structlog.get_logger(__name__)

# librdkafka overrides of a lease's commit producer (see the module docstring: latency).
COMMIT_PRODUCER_CONFIG: dict[str, Any] = {
    # Connect to the brokers at creation instead of lazily: with sparse connections the
    # init_transactions of a fresh producer often found no broker up yet and waited for
    # librdkafka's 500 ms PID retry timer. Measured on the shared broker (one node, load
    # average 5-8), create + init_transactions, 15 producers each: p50 0.079 s, p90 0.513 s
    # (bimodal 0.06 / 0.51) sparse; p50 0.007 s, max 0.014 s not. The price: each lease
    # producer opens a connection to every broker of the cluster, not only its coordinators.
    "enable.sparse.connections": False,
    "retry.backoff.ms": 5,
    "retry.backoff.max.ms": 50,
    # A transaction is only ever open for one commit: a holder paused longer than this
    # inside one has it aborted by the coordinator (its epoch bumped: fenced here).
    "transaction.timeout.ms": 60_000,
}
INIT_TIMEOUT_SECONDS = 30.0
COMMIT_TIMEOUT_SECONDS = 10.0
PARALLEL_COMMITS = 8  # partitions whose transactions run at once


def transactional_id(group: str, tp: TP) -> str:
    """The one ``transactional.id`` of a lease: every holder of (group, topic, partition)
    uses it, so each new holder's initialisation fences the previous one (so does an
    offset reset's: services/assigner/kafka_reset.py)."""
    return commitmeta.lease_transactional_id(group, tp.topic, tp.partition)


class LeaseFenced(Exception):
    """Kafka refused a lease's commit for good: a newer holder initialised its
    ``transactional.id`` (or the producer became unusable). The lease is over here."""

    def __init__(self, tp: TP, epoch: int, error: KafkaError | None) -> None:
        super().__init__(f"{tp.topic}[{tp.partition}] epoch {epoch}: {error}")
        self.tp = tp
        self.epoch = epoch
        self.error = error


@dataclass
class _Held:
    epoch: int
    producer: Producer


@dataclass
class CommitResult:
    committed: list[TP]
    fenced: list[LeaseFenced]
    failed: dict[TP, KafkaException]  # retriable: the transaction was aborted; try again


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def is_fenced(error: KafkaError | None) -> bool:
    """The error means another producer took the ``transactional.id`` (or this one is
    fatally broken): the lease may never commit again here."""
    return error is not None and (error.code() in FENCED_CODES or error.fatal())


class FencedCommitter:
    """The lease producers of one sidecar. Thread-safe: ``open`` runs on the fetch thread,
    ``commit`` on the commit thread, ``close`` on either."""

    def __init__(
        self,
        group: str,
        make_producer: Callable[[str], Producer],
        group_metadata: Callable[[], Any],
    ) -> None:
        self.group = group
        self._make_producer = make_producer
        self._group_metadata = group_metadata
        self._metadata: Any = None
        self._held: dict[TP, _Held] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(PARALLEL_COMMITS, thread_name_prefix="lease-commit")

    def holds(self, tp: TP, epoch: int) -> bool:
        with self._lock:
            held = self._held.get(tp)
        return held is not None and held.epoch == epoch

    def open(self, leases: Mapping[TP, int]) -> dict[TP, KafkaException]:
        """Initialise each lease's id (fencing its previous holder), in parallel; call
        before reading the start offsets. Returns the leases that could not be opened."""
        errors: dict[TP, KafkaException] = {}
        futures = {tp: self._pool.submit(self._open_one, tp, epoch) for tp, epoch in leases.items()}
        for tp, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                errors[tp] = exc
        return errors

    def _open_one(self, tp: TP, epoch: int) -> None:
        self.close(tp)  # an older epoch's producer of this sidecar: fenced by this one anyway
        started = time.monotonic()
        producer = self._make_producer(transactional_id(self.group, tp))
        try:
            producer.init_transactions(INIT_TIMEOUT_SECONDS)
        except KafkaException:
            _close(producer)
            raise
        with self._lock:
            self._held[tp] = _Held(epoch, producer)
        log.info(
            "lease commit producer initialised: the previous holder is fenced",
            topic=tp.topic, partition=tp.partition, epoch=epoch,
            seconds=round(time.monotonic() - started, 3),
        )  # fmt: skip

    def commit(self, offsets: Iterable[tuple[TP, int, TopicPartition]]) -> CommitResult:
        """One transaction per (partition, epoch, offset) given; partitions in parallel."""
        if self._metadata is None:
            self._metadata = self._group_metadata()
        todo = list(offsets)
        result = CommitResult([], [], {})
        if len(todo) == 1:
            outcomes = [self._commit_one(*todo[0])]
        else:
            outcomes = list(self._pool.map(lambda a: self._commit_one(*a), todo))
        for (tp, _epoch, _offset), outcome in zip(todo, outcomes, strict=True):
            if outcome is None:
                result.committed.append(tp)
            elif isinstance(outcome, LeaseFenced):
                result.fenced.append(outcome)
            else:
                result.failed[tp] = outcome
        return result

    def _commit_one(
        self, tp: TP, epoch: int, offset: TopicPartition
    ) -> LeaseFenced | KafkaException | None:
        with self._lock:
            held = self._held.get(tp)
        if held is None or held.epoch != epoch:
            return LeaseFenced(tp, epoch, None)  # no producer for this epoch: never re-init
        producer = held.producer
        try:
            producer.begin_transaction()
            producer.send_offsets_to_transaction([offset], self._metadata, COMMIT_TIMEOUT_SECONDS)
            producer.commit_transaction(COMMIT_TIMEOUT_SECONDS)
            return None
        except KafkaException as exc:
            error = _kafka_error(exc)
            if not is_fenced(error) and self._aborted(producer):
                return exc  # nothing of it applied; the next round tries again
            log.warning(
                "lease commit refused by Kafka: fenced by a newer holder",
                topic=tp.topic, partition=tp.partition, epoch=epoch, error=str(error),
            )  # fmt: skip
            self._drop(tp, held)
            return LeaseFenced(tp, epoch, error)

    @staticmethod
    def _aborted(producer: Producer) -> bool:
        """Abort the transaction a failed commit left open; False if the producer cannot
        (it was fenced meanwhile, or is fatally broken)."""
        try:
            producer.abort_transaction(COMMIT_TIMEOUT_SECONDS)
        except KafkaException as exc:
            return not is_fenced(_kafka_error(exc)) and _abort_was_idle(exc)
        return True

    def _drop(self, tp: TP, held: _Held) -> None:
        with self._lock:
            if self._held.get(tp) is held:
                del self._held[tp]
        _close(held.producer)

    def close(self, tp: TP) -> None:
        """The lease ended here: its producer goes (no transaction is open between
        commits)."""
        with self._lock:
            held = self._held.pop(tp, None)
        if held is not None:
            _close(held.producer)

    def close_all(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            _close(h.producer)
        self._pool.shutdown(wait=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def _abort_was_idle(exc: KafkaException) -> bool:
    """abort_transaction refused only because no transaction was open (the failure came
    from begin_transaction): the producer is still usable."""
    error = _kafka_error(exc)
    return error is not None and error.code() == KafkaError._STATE


def _close(producer: Producer) -> None:
    """Close a lease producer; a fenced (fatal) one raises its error from close: ignored,
    it holds no transaction any more."""
    with contextlib.suppress(KafkaException):
        producer.close()
