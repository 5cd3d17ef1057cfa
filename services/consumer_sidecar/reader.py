"""Exact offset-range reads for ``StreamService.ReadRange`` (Spark, ARCHITECTURE §7).

A range read must not move the group's position, so it never touches the fetch thread's
consumer: every read has a confluent-kafka ``Consumer`` of its own while it runs, only ever
``assign()``-ed (never ``subscribe()``-d), never committing. A read that ends at its range's
end gives its consumer back (unassigned) to a small pool for the next read, so Spark's
reads of one partition after another do not each pay a new consumer's connection set-up
(a read that failed or was stopped closes its consumer). Its ``group.id`` is
``<group>.ds-reader``, not the leased group's id: Kafka accepts commits from non-members
only while a group is empty (§10), so nothing that could join or commit may use that id.

All of it is blocking librdkafka I/O: the servicer runs it on :attr:`RangeReaders.executor`
(its own small thread pool, so long reads never starve the event loop's default executor).

A chunk is protobuf ``Record`` messages (RECORDS) or one Arrow IPC stream
(ARROW_IPC, ``arrow_chunks.py``, built from the Kafka messages with no ``Record`` in
between); either way it stays within the request's ``max_bytes`` and holds at least one
record.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from google.protobuf import timestamp_pb2

from dataservice.common.v1 import common_pb2
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

CONSUME_BATCH = 500
CONSUME_TIMEOUT_SECONDS = 0.2
# Bytes a record adds to a response besides its own encoding (field tag and length).
RESPONSE_FIELD_OVERHEAD = 8


class RangeOutOfRange(Exception):
    """The range is not inside [log start offset, high watermark] of the partition."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__(f"the partition's log spans [{low}, {high})")
        self.low = low
        self.high = high


class ReadStalled(Exception):
    """No progress from Kafka for the stall timeout (broker down, or an open transaction
    holding the last stable offset below the range's end)."""


@dataclass(frozen=True)
class RangeSpec:
    tp: TP
    from_offset: int
    to_offset: int  # exclusive
    max_bytes: int  # per chunk; a chunk holds at least one record whatever its size
    epoch: int  # stamped on every record read
    arrow: bool = False  # ARROW_IPC chunks instead of Records


@dataclass
class Chunk:
    records: list[common_pb2.Record]  # RECORDS format; empty with ARROW_IPC
    next_offset: int  # first offset of the next chunk, or to_offset in the last one
    arrow_ipc: bytes = b""  # ARROW_IPC format: one Arrow IPC stream of the chunk's records
    count: int = 0  # records in the chunk
    payload_bytes: int = 0  # their key plus value bytes


def _arrow() -> ModuleType:
    """arrow_chunks (and pyarrow) on the first ARROW_IPC read only."""
    from services.consumer_sidecar import arrow_chunks

    return arrow_chunks


class RangeRead:
    """One open range: call :meth:`next_chunk` until it returns a chunk whose
    ``next_offset`` is the range's end. Not for concurrent use, except :meth:`close`."""

    def __init__(
        self,
        consumer: Consumer,
        spec: RangeSpec,
        stall_timeout: float,
        give_back: Callable[[Consumer], None] | None = None,
    ) -> None:
        self._consumer = consumer
        # Takes the consumer once the read reached its end (else close() closes it).
        self._give_back = give_back
        self._failed = False
        self._spec = spec
        self._stall_timeout = stall_timeout
        self._backlog: deque[Message] = deque()
        self._reached_end = False
        self._done = False
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def next_chunk(self) -> Chunk | None:
        """Blocking: the next chunk, or None once the range is done or closed."""
        with self._lock:
            if self._done or self._closed.is_set():
                return None
            try:
                return self._next_arrow_chunk() if self._spec.arrow else self._next_chunk()
            except BaseException:
                self._failed = True
                raise

    def _next_chunk(self) -> Chunk | None:
        records: list[common_pb2.Record] = []
        size = payload = 0
        next_offset = self._spec.to_offset
        while self._more():
            msg = self._backlog[0]
            record = to_record(msg)
            record.lease_epoch = self._spec.epoch
            msg_bytes = record.ByteSize() + RESPONSE_FIELD_OVERHEAD
            if records and size + msg_bytes > self._spec.max_bytes:
                next_offset = int(msg.offset() or 0)
                break
            self._backlog.popleft()
            records.append(record)
            size += msg_bytes
            payload += len(record.key) + len(record.value)
        if self._closed.is_set():
            return None
        return Chunk(records, next_offset=next_offset, count=len(records), payload_bytes=payload)

    def _next_arrow_chunk(self) -> Chunk | None:
        arrow = _arrow()
        columns = arrow.Columns(self._spec.tp.topic, self._spec.tp.partition)
        budget = self._spec.max_bytes - arrow.STREAM_OVERHEAD
        size = payload = 0
        next_offset = self._spec.to_offset
        while self._more():
            # Everything buffered at once (a consume() batch): Columns.add_many takes what
            # fits, column by column, and the rest waits for the next chunk.
            buffered = list(self._backlog)
            self._backlog.clear()
            taken, taken_bytes, taken_payload = columns.add_many(buffered, budget - size)
            size += taken_bytes
            payload += taken_payload
            if taken < len(buffered):
                self._backlog.extend(buffered[taken:])
                next_offset = int(buffered[taken].offset() or 0)
                break
        if self._closed.is_set():
            return None
        return Chunk(
            [],
            next_offset=next_offset,
            arrow_ipc=columns.encode() if len(columns) else b"",
            count=len(columns),
            payload_bytes=payload,
        )

    def _more(self) -> bool:
        """Whether a message of the range is buffered (consuming until one is, or the
        range's end is seen, or the read is closed)."""
        while not self._backlog:
            if self._reached_end:
                self._done = True
                return False
            if self._closed.is_set():
                return False
            self._fill()
        return True

    def _fill(self) -> None:
        """Consume until at least one record of the range is buffered or its end is seen."""
        stall_deadline = time.monotonic() + self._stall_timeout
        while not self._closed.is_set():
            messages = self._consumer.consume(CONSUME_BATCH, CONSUME_TIMEOUT_SECONDS)
            if (
                messages
                and int(messages[-1].offset() or 0) < self._spec.to_offset
                and all(m.error() is None for m in messages)
            ):
                # The usual batch: records only, all inside the range (one partition's
                # offsets rise), buffered at once rather than checked one by one.
                self._backlog.extend(messages)
                return
            for msg in messages:
                error = msg.error()
                if error is not None:
                    self._on_error(error, int(msg.offset() or 0))
                    if self._reached_end:
                        return
                    continue
                offset = int(msg.offset() or 0)
                if offset >= self._spec.to_offset:
                    self._reached_end = True  # past the end, or a gap reaching over it
                    return
                self._backlog.append(msg)
            if self._backlog:
                return
            if time.monotonic() > stall_deadline:
                raise ReadStalled(
                    f"no records from {self._spec.tp.topic}[{self._spec.tp.partition}] "
                    f"for {self._stall_timeout:.0f} s"
                )

    def _on_error(self, error: KafkaError, offset: int) -> None:
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            # The end of the log (or of the stable part): what is left of the range up to
            # here were gaps (compaction, transaction markers, aborted records).
            if offset >= self._spec.to_offset:
                self._reached_end = True
            return
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            # Retention deleted the start of the range after it was validated.
            raise RangeOutOfRange(-1, -1)
        if error.fatal():
            raise KafkaException(error)
        log.info("range read: transient kafka error", error=error.str())

    def close(self) -> None:
        """Stop a read in progress (from any thread) and close its consumer, or give it
        back for the next read when this one ended cleanly at its range's end."""
        reusable = self._done and not self._failed and not self._closed.is_set()
        self._closed.set()
        with self._lock:
            self._done = True
            give_back, self._give_back = self._give_back, None
            if reusable and give_back is not None:
                give_back(self._consumer)
                return
            with contextlib.suppress(RuntimeError):  # already closed
                self._consumer.close()


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """A consumer config without its callbacks (made anew per call, never equal)."""
    return {key: value for key, value in config.items() if not callable(value)}


class RangeReaders:
    """Opens range reads and answers watermark queries, on its own threads."""

    def __init__(
        self,
        config: Callable[[], dict[str, Any]],
        *,
        max_workers: int = 8,
        stall_timeout: float = 30.0,
        kafka_timeout: float = 10.0,
        prefetch_bytes: int = 0,
        max_idle: int = 4,
        idle_seconds: float = 60.0,
    ) -> None:
        self._config = config
        # What one reader's consumer may hold prefetched (its config's bound; read_budget).
        self.prefetch_bytes = prefetch_bytes
        self.stall_timeout = stall_timeout
        self.kafka_timeout = kafka_timeout
        self.executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ds-reader")
        self._watermark_consumer: Consumer | None = None
        self._watermark_lock = threading.Lock()
        # Consumers of reads that ended, unassigned, with the settings they were made with
        # (their config without callbacks) and when they came back: the next read takes
        # one instead of making a consumer.
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self._idle: list[tuple[Consumer, dict[str, Any], float]] = []
        self._idle_lock = threading.Lock()
        self._closed = False
        self.consumers_made = 0  # for tests and the benchmark: how many were made

    def _new_consumer(self, config: dict[str, Any] | None = None) -> Consumer:
        self.consumers_made += 1
        return Consumer(config if config is not None else self._consumer_config())

    def _consumer_config(self) -> dict[str, Any]:
        return {
            **self._config(),
            # The end of the log is how a range whose tail is all gaps ends.
            "enable.partition.eof": True,
            # Never jump silently: a start below the log start is an error, not "earliest".
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
        }

    def _take_consumer(self) -> tuple[Consumer, dict[str, Any]]:
        """An idle consumer made with today's config (the sidecar's config can change live),
        or a new one; idle ones past ``idle_seconds`` or made with another config close."""
        config = self._consumer_config()
        settings = _settings(config)
        stale: list[Consumer] = []
        taken: Consumer | None = None
        with self._idle_lock:
            now = time.monotonic()
            keep: list[tuple[Consumer, dict[str, Any], float]] = []
            for consumer, made_with, since in self._idle:
                if made_with != settings or now - since > self.idle_seconds:
                    stale.append(consumer)
                elif taken is None:
                    taken = consumer
                else:
                    keep.append((consumer, made_with, since))
            self._idle = keep
        for consumer in stale:
            with contextlib.suppress(Exception):
                consumer.close()
        return (taken if taken is not None else self._new_consumer(config)), settings

    def _give_back(self, consumer: Consumer, settings: dict[str, Any]) -> None:
        """A read ended at its range's end: keep its consumer, unassigned, for the next."""
        try:
            consumer.unassign()
        except Exception:  # a consumer that cannot unassign is not reused
            with contextlib.suppress(Exception):
                consumer.close()
            return
        with self._idle_lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append((consumer, settings, time.monotonic()))
                return
        with contextlib.suppress(Exception):
            consumer.close()

    def idle(self) -> int:
        """Consumers waiting for the next read."""
        with self._idle_lock:
            return len(self._idle)

    def open(self, spec: RangeSpec) -> RangeRead:
        """Blocking: validate the range against the watermarks and start reading it."""
        consumer, settings = self._take_consumer()
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(spec.tp.topic, spec.tp.partition), timeout=self.kafka_timeout
            )
            if spec.from_offset < low or spec.to_offset > high:
                raise RangeOutOfRange(low, high)
            consumer.assign([TopicPartition(spec.tp.topic, spec.tp.partition, spec.from_offset)])
        except BaseException:
            consumer.close()
            raise
        return RangeRead(
            consumer,
            spec,
            self.stall_timeout,
            give_back=functools.partial(self._give_back, settings=settings),
        )

    def watermarks(self, tp: TP) -> tuple[int, int]:
        """Blocking: (log start offset, high watermark) as the partition leader says now."""
        with self._watermark_lock:
            if self._watermark_consumer is None:
                self._watermark_consumer = self._new_consumer()
            low, high = self._watermark_consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=self.kafka_timeout
            )
            return int(low), int(high)

    def close(self) -> None:
        with self._watermark_lock:
            if self._watermark_consumer is not None:
                self._watermark_consumer.close()
                self._watermark_consumer = None
        with self._idle_lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for consumer, _, _ in idle:
            with contextlib.suppress(Exception):
                consumer.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def to_record(msg: Message) -> common_pb2.Record:
    """One Message as a Record (ReadRange's RECORDS format)."""
    record = common_pb2.Record(
        topic=str(msg.topic()), partition=int(msg.partition() or 0), offset=int(msg.offset() or 0)
    )
    key = msg.key()
    if key is not None:
        record.key = key if isinstance(key, bytes) else str(key).encode()
    value = msg.value()
    if value is not None:
        record.value = value if isinstance(value, bytes) else str(value).encode()
    ts_type, ts = msg.timestamp()
    if ts_type != 0 and ts >= 0:
        record.timestamp.CopyFrom(
            timestamp_pb2.Timestamp(seconds=ts // 1000, nanos=(ts % 1000) * 1_000_000)
        )
    headers = msg.headers()
    if headers:
        for hkey, hvalue in headers:  # type: ignore[str-unpack]  # list of (key, value)
            raw = hvalue if isinstance(hvalue, bytes) else str(hvalue or "").encode()
            record.headers.add(key=str(hkey), value=raw)
    return record
