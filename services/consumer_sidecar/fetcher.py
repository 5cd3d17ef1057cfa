"""The one Kafka consume loop of a sidecar, on its own thread.

It polls continuously, whatever the application does (so an infrequent caller can never
make Kafka kick anybody, ARCHITECTURE §1.2), buffers records per partition, and pauses a
partition whose buffer is full so memory stays under the cap (backpressure). Partitions
are added and removed with ``incremental_assign``/``incremental_unassign`` — never
``subscribe()``, so Kafka never rebalances a leased group. Every consumer call happens on
this thread: other threads hand it commands and wait on a future.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from google.protobuf import timestamp_pb2

from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.partitions import TP, PartitionTable

log = structlog.get_logger(__name__)
R = TypeVar("R")

POLL_TIMEOUT_SECONDS = 0.05
# A paused partition resumes once its buffer falls below this share of its cap.
RESUME_FRACTION = 0.5


@dataclass(frozen=True)
class CommitRequest:
    tp: TP
    offset: int
    epoch: int


class Fetcher:
    def __init__(
        self,
        consumer: Consumer,
        table: PartitionTable,
        *,
        sidecar_id: str,
        batch: int,
        on_data: Callable[[], None],
        on_error: Callable[[KafkaError], None] | None = None,
    ) -> None:
        self._consumer = consumer
        self._table = table
        self._sidecar_id = sidecar_id
        self._batch = batch
        self._on_data = on_data
        self._on_error = on_error
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-fetch", daemon=True)
        self.last_poll = time.monotonic()

    # ---- API for other threads --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def call(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on the fetch thread (between polls); a future of its result."""
        future: Future[R] = Future()
        self._commands.put((functools.partial(fn, *args), future))
        return future

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.wrap_future(self.call(fn, *args))

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]:
        """Fetch thread: start fetching each partition at its start offset (<0 = the group's
        committed offset, else the earliest). One committed() round trip for the batch.
        Returns the offset each partition starts from."""
        resolved = dict(starts)
        unknown = [TopicPartition(tp.topic, tp.partition) for tp, o in starts.items() if o < 0]
        if unknown:
            for found in self._consumer.committed(unknown, timeout=10):
                resolved[TP(str(found.topic), int(found.partition or 0))] = int(found.offset or -1)
        for tp, offset in resolved.items():
            if offset < 0:
                low, _high = self._consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10
                )
                resolved[tp] = low if low >= 0 else OFFSET_BEGINNING
        self._consumer.incremental_assign(
            [TopicPartition(tp.topic, tp.partition, offset) for tp, offset in resolved.items()]
        )
        return resolved

    def suspend(self, tp: TP, next_offset: int) -> None:
        """Fetch thread: pause ``tp`` and rewind to the first undelivered record, so the
        dropped buffer is fetched again if the lease is renewed."""
        ktp = TopicPartition(tp.topic, tp.partition, next_offset)
        self._consumer.pause([ktp])
        self._consumer.seek(ktp)

    def resume(self, tp: TP) -> None:
        self._consumer.resume([TopicPartition(tp.topic, tp.partition)])

    def unassign(self, tp: TP) -> None:
        self._consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])

    def commit(self, requests: list[CommitRequest]) -> None:
        """Fetch thread: synchronous commit; the metadata records the lease epoch (§3.1.6)."""
        offsets = [
            TopicPartition(
                r.tp.topic,
                r.tp.partition,
                r.offset,
                metadata=f'{{"epoch":{r.epoch},"sidecar":"{self._sidecar_id}"}}',
            )
            for r in requests
        ]
        result = self._consumer.commit(offsets=offsets, asynchronous=False)
        for tp in result or []:
            if tp.error is not None:
                raise KafkaException(tp.error)

    # ---- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._run_commands()
                messages = self._consumer.consume(self._batch, POLL_TIMEOUT_SECONDS)
                self.last_poll = time.monotonic()
                if messages:
                    self._buffer(messages)
                self._apply_backpressure()
        except Exception:
            log.exception("fetch loop crashed")
            raise
        finally:
            self._run_commands()
            self._consumer.close()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _buffer(self, messages: list[Message]) -> None:
        by_tp: dict[TP, list[common_pb2.Record]] = {}
        for msg in messages:
            error = msg.error()
            if error is not None:
                if self._on_error is not None:
                    self._on_error(error)
                continue
            tp = TP(str(msg.topic()), int(msg.partition() or 0))
            by_tp.setdefault(tp, []).append(_to_record(msg))
        added = False
        for tp, records in by_tp.items():
            if self._table.append(tp, records):
                added = True
        if added:
            self._on_data()

    def _apply_backpressure(self) -> None:
        cap = self._table.per_partition_cap()
        over_total = self._table.buffered_bytes >= self._table.buffer_max_bytes
        to_pause: list[TopicPartition] = []
        to_resume: list[TopicPartition] = []
        for part in self._table.snapshot():
            if part.suspended_at is not None or not part.ready:
                continue  # paused by the lease keeper, not by backpressure
            full = over_total or part.buffered_bytes >= cap
            if full and not part.paused:
                part.paused = True
                to_pause.append(TopicPartition(part.tp.topic, part.tp.partition))
            elif part.paused and not over_total and part.buffered_bytes < cap * RESUME_FRACTION:
                part.paused = False
                to_resume.append(TopicPartition(part.tp.topic, part.tp.partition))
        if to_pause:
            self._consumer.pause(to_pause)
        if to_resume:
            self._consumer.resume(to_resume)


def _to_record(msg: Message) -> common_pb2.Record:
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
