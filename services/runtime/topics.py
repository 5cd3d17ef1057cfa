"""Topics: create one and wait until it serves, and a compacted topic read as a table.

Two services keep durable state in a compacted topic (the assigner's ``__ds_assigner_state``,
the notifier's alert templates) and four places create topics (those two, the notifier's
fault and alert topics, ``dsctl dev`` and the devstack). They all go through here:

- :func:`ensure_topic` creates a topic unless it exists and, when it created it, waits
  until every partition serves (KAFKA-15591: a write to a partition not yet served can be
  acknowledged and lost, see :func:`partitions_serving`).
- :class:`CompactedTopic` is a one-partition compacted topic: :meth:`~CompactedTopic.load`
  reads it to its end, :meth:`~CompactedTopic.tail` keeps applying what comes after, and
  :meth:`~CompactedTopic.produce` writes records and resolves once Kafka acknowledged them.
  It only moves bytes: what a key or a value means is the store's business, so a store's
  records are the same bytes whether written before or after this module existed.

Its Kafka clients come from the factories in :mod:`services.runtime.kafka`. This is its own
module, not part of ``kafka.py``, because it owns threads and a read/write protocol while
``kafka.py`` only configures clients.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.cimpl import NewTopic  # admin re-exports it without __all__ (mypy)

from services.runtime.kafka import new_admin, new_consumer, new_producer
from services.runtime.settings import ServiceSettings

log = structlog.get_logger(__name__)

# The replication a topic gets when its spec leaves it open: the usual 3 replicas with
# min.insync.replicas 2 (acks=all writes survive one broker down), scaled down to a
# smaller cluster.
DEFAULT_REPLICATION = 3
DEFAULT_MIN_INSYNC = 2


# The producer thread's poll(): a delivery report ends it at once (produce() from another
# thread is not held up by it), so the timeout only bounds how long close() waits for the
# thread. 0.05 s woke each store's thread 20 times a second for nothing (issue 34).
PRODUCER_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class TopicSpec:
    """What a topic is created with. An existing topic is left as it is."""

    name: str
    partitions: int = 1
    # None: as many replicas as the cluster has brokers, up to DEFAULT_REPLICATION, and
    # min.insync.replicas up to DEFAULT_MIN_INSYNC unless ``config`` names it.
    replication: int | None = None
    config: Mapping[str, str] = field(default_factory=dict)

    def new_topic(self, brokers: int) -> NewTopic:
        """The CreateTopics request for a cluster of ``brokers`` brokers (pure)."""
        config = dict(self.config)
        replication = self.replication
        if replication is None:
            replication = min(DEFAULT_REPLICATION, brokers)
            config.setdefault("min.insync.replicas", str(min(DEFAULT_MIN_INSYNC, replication)))
        return NewTopic(
            self.name,
            num_partitions=self.partitions,
            replication_factor=replication,
            config=config,
        )


def ensure_topic(admin: AdminClient, spec: TopicSpec, *, timeout: float = 30.0) -> bool:
    """Create ``spec.name`` unless it exists; True if this call created it.

    A created topic is waited for until every partition serves, so the caller may write
    at once. Existence is read from the whole cluster's metadata, not by asking for the
    topic by name: a metadata request naming a topic may auto-create it with the broker's
    defaults (not compacted), and a topic that exists needs no CREATE permission. A
    concurrent creator winning the race is fine (TOPIC_ALREADY_EXISTS). Blocking; raises
    KafkaException (a refused creation, or no serving partitions within ``timeout``).
    """
    metadata = admin.list_topics(timeout=min(10.0, timeout))
    if spec.name in metadata.topics:
        return False
    request = spec.new_topic(len(metadata.brokers))
    futures = admin.create_topics([request], operation_timeout=timeout, request_timeout=timeout)
    # exception(), not result(): a raised traceback would pin the AdminClient in a cycle.
    error = futures[spec.name].exception(timeout=timeout)
    if error is not None:
        if already_exists(error):
            return False
        raise error
    log.info(
        "created topic",
        topic=spec.name,
        partitions=spec.partitions,
        replication=request.replication_factor,
    )
    wait_partitions_serving(admin, spec.name, spec.partitions, timeout=timeout)
    return True


def already_exists(error: BaseException) -> bool:
    """Whether a CreateTopics error says the topic is there already."""
    args = getattr(error, "args", ())
    code = args[0].code() if args and isinstance(args[0], KafkaError) else None
    return code == KafkaError.TOPIC_ALREADY_EXISTS


def partitions_serving(admin: AdminClient, topic: str, partitions: int) -> bool:
    """True once every partition of ``topic`` answers ListOffsets from its leader.

    A new topic's leaders appear in the metadata a few hundred milliseconds before they
    serve the partitions, and on Kafka 4.1.1 records produced in that window can be
    acknowledged and still be missing from the log (KAFKA-15591; measured here: 4 of 25
    fresh topics lost their first batch). The test stack runs a Kafka with the fix (4.4.0);
    brokers without it are still in service, so whoever creates a topic and then writes to
    it waits for this first.
    """
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(topic, p): latest for p in range(partitions)}
    futures = admin.list_offsets(request, request_timeout=5)
    # exception(), not result(): a raised traceback would pin the AdminClient in a cycle.
    return all(f.exception(timeout=10) is None for f in futures.values())


def wait_partitions_serving(
    admin: AdminClient, topic: str, partitions: int, timeout: float = 30.0
) -> None:
    """Block until :func:`partitions_serving`; KafkaException when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not partitions_serving(admin, topic, partitions):
        if time.monotonic() >= deadline:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"topic {topic}: partitions not served")
            )
        time.sleep(0.1)
        # ListOffsets finds leaders in the client's metadata cache, which can keep a new
        # topic without leaders for longer than the timeout ("No leaders found": seen here
        # on about one in ten fresh topics); a metadata request naming the topic refreshes
        # it (and creates nothing: the topic exists by now).
        admin.list_topics(topic=topic, timeout=5)


# -- a compacted topic read as a table -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One record as stored: ``value`` None is a tombstone (the key is deleted)."""

    key: bytes
    value: bytes | None
    offset: int


Apply = Callable[[Record], None]
"""Folds one record into the caller's table; called in offset order."""


class CompactedTopic:
    """A one-partition compacted topic (one partition: records apply in the order written).

    ``load`` and ``tail`` read with ``assign()`` under a group that never joins and never
    commits; ``produce`` writes through an idempotent ``acks=all`` producer served by a
    thread of its own, so delivery reports arrive whether or not anyone awaits them.
    """

    def __init__(
        self,
        settings: ServiceSettings,
        name: str,
        *,
        client_id: str,
        replication: int | None = None,
        config: Mapping[str, str] | None = None,
        admin: AdminClient | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.spec = TopicSpec(name, 1, replication, {"cleanup.policy": "compact", **(config or {})})
        self._settings = settings
        self._client_id = client_id
        self._admin = admin or new_admin(settings, client_id=client_id)
        self._producer: Producer = new_producer(
            settings, client_id=client_id, overrides=producer_overrides
        )
        self._stop = threading.Event()
        self._poller = threading.Thread(
            target=self._serve_producer, name=f"{client_id}-producer", daemon=True
        )
        self._poller.start()
        self._tail: threading.Thread | None = None

    # ---- set-up and reads (blocking: call through asyncio.to_thread) -------------------

    def ensure(self, timeout: float = 30.0) -> bool:
        """:func:`ensure_topic` for this topic; True if this call created it."""
        return ensure_topic(self._admin, self.spec, timeout=timeout)

    def load(self, apply: Apply, *, timeout: float = 60.0) -> int:
        """Apply every record from the beginning to the end the topic has now, in order;
        returns the offset to tail from. TimeoutError when the end is not reached within
        ``timeout``; KafkaException when the partition cannot be read."""
        consumer = self._new_consumer(partition_eof=True)
        try:
            low, end = consumer.get_watermark_offsets(TopicPartition(self.name, 0), timeout=10)
            if end <= low:
                return int(end)
            consumer.assign([TopicPartition(self.name, 0, OFFSET_BEGINNING)])
            position = int(low)
            deadline = time.monotonic() + timeout
            while position < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"topic {self.name}: read stalled at offset {position} of {end}"
                        f" after {timeout:g}s"
                    )
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    # The end, with what compaction or transaction markers left out.
                    return max(position, int(msg.offset() or 0))
                record = _record(msg)
                apply(record)
                position = record.offset + 1
            return position
        finally:
            consumer.close()

    def tail(self, apply: Apply, *, start: int) -> None:
        """Apply every record from offset ``start`` on, on a thread of its own, until
        :meth:`close`. A failed read is logged and resumed from the last applied record."""
        if self._tail is not None:
            raise RuntimeError(f"topic {self.name} is tailed already")
        self._tail = threading.Thread(
            target=self._follow, args=(apply, start), name=f"{self._client_id}-tail", daemon=True
        )
        self._tail.start()

    def _follow(self, apply: Apply, position: int) -> None:
        while not self._stop.is_set():
            consumer = self._new_consumer(partition_eof=False)
            try:
                consumer.assign([TopicPartition(self.name, 0, position)])
                while not self._stop.is_set():
                    for msg in consumer.consume(500, 0.5):
                        if msg.error() is not None:
                            continue  # librdkafka recovers by itself; nothing to apply
                        record = _record(msg)
                        apply(record)
                        position = record.offset + 1
            except Exception as exc:
                log.warning("topic reader failed; restarting", topic=self.name, error=repr(exc))
                self._stop.wait(1.0)
            finally:
                consumer.close()

    def _new_consumer(self, *, partition_eof: bool) -> Consumer:
        return new_consumer(
            self._settings,
            group=f"{self._client_id}-reader",  # assign() only: never joins, never commits
            client_id=self._client_id,
            overrides={"enable.partition.eof": partition_eof},
        )

    # ---- writes -----------------------------------------------------------------------

    def produce(
        self, records: Sequence[tuple[bytes, bytes | None]], *, timeout: float
    ) -> asyncio.Future[list[int]]:
        """Write ``records`` (key, value; None is a tombstone) in order, now.

        The future resolves to their offsets once Kafka acknowledged all of them, or fails
        with the first delivery error (KafkaException), or with TimeoutError after
        ``timeout`` seconds (a record still queued then may yet be written). Called on the
        event loop; the records are handed to the producer before this returns, so two
        calls are written in call order whether or not anyone awaits the first.
        """
        delivery = Delivery(asyncio.get_running_loop(), len(records), self.name, timeout)
        try:
            for index, (key, value) in enumerate(records):
                self._producer.produce(
                    self.name, key=key, value=value, on_delivery=delivery.callback(index)
                )
        except (BufferError, KafkaException) as exc:
            delivery.fail(exc)
        return delivery.future

    def _serve_producer(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(PRODUCER_POLL_SECONDS)

    def close(self, flush_timeout: float = 10.0) -> None:
        """Stop tailing, give queued writes ``flush_timeout`` seconds, stop the producer
        thread (blocking)."""
        self._stop.set()
        if self._tail is not None:
            self._tail.join(10)
        self._producer.flush(flush_timeout)
        self._poller.join(timeout=5)


def _record(msg: Message) -> Record:
    key = msg.key()
    value = msg.value()
    return Record(
        key=key if isinstance(key, bytes) else b"",
        value=value if isinstance(value, bytes) or value is None else str(value).encode(),
        offset=int(msg.offset() or 0),
    )


class Delivery:
    """One future for a batch of writes, settled from librdkafka's delivery reports.

    The reports come on the producer's thread; the future belongs to the event loop, so
    every report is handed over with ``call_soon_threadsafe``. Reports after the future
    is settled (an earlier error, the timeout) are dropped.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, count: int, topic: str, timeout: float
    ) -> None:
        self.future: asyncio.Future[list[int]] = loop.create_future()
        self._loop = loop
        self._offsets: list[int] = [-1] * count
        self._remaining = count
        self._timer: asyncio.TimerHandle | None = None
        if count == 0:
            self.future.set_result([])
            return
        self._timer = loop.call_later(timeout, self._time_out, topic, timeout)

    def callback(self, index: int) -> Callable[[KafkaError | None, Message], None]:
        """The ``on_delivery`` of record ``index`` (runs on the producer's thread)."""

        def on_delivery(error: KafkaError | None, msg: Message) -> None:
            self._loop.call_soon_threadsafe(self.settle, index, error, int(msg.offset() or 0))

        return on_delivery

    def settle(self, index: int, error: KafkaError | None, offset: int) -> None:
        """One delivery report, on the loop."""
        if self.future.done():
            return
        if error is not None:
            self.fail(KafkaException(error))
            return
        self._offsets[index] = offset
        self._remaining -= 1
        if self._remaining == 0:
            self._cancel_timer()
            self.future.set_result(self._offsets)

    def _time_out(self, topic: str, timeout: float) -> None:
        count = len(self._offsets)
        self.fail(
            TimeoutError(
                f"topic {topic}: {self._remaining} of {count} record(s) not acknowledged"
                f" within {timeout:g}s"
            )
        )

    def fail(self, exc: BaseException) -> None:
        if self.future.done():
            return
        self._cancel_timer()
        self.future.set_exception(exc)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
