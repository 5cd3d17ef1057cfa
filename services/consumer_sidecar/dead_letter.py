"""The group's dead-letter topic (issue 39): a record given up past ``max_deliveries`` is
produced there, with headers naming its origin, before the commit point passes it.

How "never both lost and committed" holds:

* :mod:`acks` *parks* a given-up record instead of forgetting it: it stays in flight to
  ``DEAD_LETTER`` with no deadline, so the commit point cannot pass it.
* :class:`DeadLetterWriter` reads the record again from Kafka (the ack tracker keeps
  offsets, never records) and produces it with the sidecar's idempotent producer
  (``acks=all``), then waits for every delivery report. Only when all are acked does
  :class:`DeadLetters` ack the parked records, and only then may a commit pass them.
* If the sidecar dies, or the lease moves, before that ack, nothing was committed past the
  record: the next holder delivers it again (its delivery count starts over) and dead-letters
  it in turn. So a record is on the dead-letter topic at least once; it is there twice only
  when the produce was acked and the commit past it was then lost (a crash, a lost lease
  between the produce's ack and the next commit, at most ``commit_interval`` later). The
  copies carry the same origin headers: ``(ds-dlq-topic, ds-dlq-partition, ds-dlq-offset)``
  identifies a record, and readers of the dead-letter topic de-duplicate on it.

No transactional producer here: the per-lease transactional commit path is another
module's (static stability); an acked idempotent produce before the commit is what
"never lost" needs. The retries of :class:`DeadLetters` last while the lease does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from services.runtime.tasks import TaskSet
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

HeaderValue = str | bytes | None
HEADER_PREFIX = "ds-dlq-"
# The origin headers every dead-lettered record carries (besides its own headers).
ORIGIN_HEADERS = (
    "ds-dlq-topic",
    "ds-dlq-partition",
    "ds-dlq-offset",
    "ds-dlq-timestamp",
    "ds-dlq-deliveries",
    "ds-dlq-last-error",
    "ds-dlq-client",
    "ds-dlq-group",
)


def topic_for(template: str, group: str) -> str:
    """The dead-letter topic of ``group`` (``template`` names it, ``{group}`` replaced);
    "" when the template is empty: no dead-letter topic."""
    return template.replace("{group}", group)


@dataclass(frozen=True)
class DeadLetterJob:
    """Records [lo, hi) of ``tp`` under lease ``epoch``, given up after ``deliveries``
    deliveries, last held by ``client``, last come due for ``why`` (nack,
    visibility_timeout, stream_end, not_sent)."""

    tp: TP
    epoch: int
    lo: int
    hi: int
    deliveries: int
    client: str
    why: str


def origin_headers(
    job: DeadLetterJob, group: str, offset: int, timestamp_ms: int
) -> list[tuple[str, bytes]]:
    """The headers naming where a dead-lettered record comes from (pure)."""
    values = (
        job.tp.topic,
        str(job.tp.partition),
        str(offset),
        str(timestamp_ms),
        str(job.deliveries),
        job.why,
        job.client,
        group,
    )
    return [(name, value.encode()) for name, value in zip(ORIGIN_HEADERS, values, strict=True)]


def dead_letter_headers(
    own: Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None,
    origin: list[tuple[str, bytes]],
) -> list[tuple[str, HeaderValue]]:
    """The record's own headers, then the origin headers; an own header that looks like
    an origin header (a record dead-lettered before, replayed) is kept under
    ``ds-dlq-previous-<name>`` so the newest origin is the one a reader finds."""
    pairs = own.items() if isinstance(own, Mapping) else own or []
    kept: list[tuple[str, HeaderValue]] = []
    for name, value in pairs:
        if name.startswith(HEADER_PREFIX) and not name.startswith(f"{HEADER_PREFIX}previous-"):
            name = f"{HEADER_PREFIX}previous-{name.removeprefix(HEADER_PREFIX)}"
        kept.append((name, value))
    return kept + list(origin)


def _log_failure(future: asyncio.Future[str]) -> None:
    if not future.cancelled() and (error := future.exception()) is not None:
        log.warning("dead-letter topic not created; retried at the first write", error=str(error))


class DeadLetterError(Exception):
    """Records could not be read again or produced (retried while the lease lasts)."""


class DeadLetterWriter:
    """Blocking: reads [lo, hi) of a partition again and produces it to the dead-letter
    topic, returning once Kafka acked every record (one thread uses it)."""

    def __init__(
        self,
        consumer: Consumer,
        producer: Producer,
        topic: str,
        group: str,
        *,
        ensure: Callable[[str], None] = lambda _topic: None,
        timeout: float = 30.0,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        # Where records go; the group's config may change it live (set by the event loop,
        # read once per write).
        self.topic = topic
        self.group = group
        self.timeout = timeout
        self._ensure = ensure
        self._ensured: set[str] = set()

    def ensure_topic(self) -> str:
        """Create the current topic unless it exists (once per topic); returns it. Raises
        KafkaException."""
        topic = self.topic
        if topic not in self._ensured:
            self._ensure(topic)
            self._ensured.add(topic)
        return topic

    def write(self, job: DeadLetterJob) -> int:
        """Produce every record of [lo, hi) that Kafka still has; how many. Offsets with no
        record (compacted away, transaction markers) are skipped. Raises DeadLetterError."""
        topic = self.ensure_topic()
        records = self._read(job)
        errors: list[str] = []

        def report(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                errors.append(error.str())

        for msg in records:
            origin = origin_headers(job, self.group, msg.offset() or 0, msg.timestamp()[1])
            self.producer.produce(
                topic,
                key=msg.key(),
                value=msg.value(),
                headers=dead_letter_headers(msg.headers(), origin),
                on_delivery=report,
            )
        left = self.producer.flush(self.timeout)
        if left or errors:
            raise DeadLetterError(
                f"{len(errors)} of {len(records)} records refused ({errors[:1]}), {left} unacked"
            )
        return len(records)

    def _read(self, job: DeadLetterJob) -> list[Message]:
        tp = job.tp
        self.consumer.assign([TopicPartition(tp.topic, tp.partition, job.lo)])
        try:
            out: list[Message] = []
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                for msg in self.consumer.consume(500, 0.5):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return out  # the log ends: nothing more of the range exists
                        raise DeadLetterError(f"re-reading {tp}: {error.str()}")
                    offset = msg.offset() or 0
                    if offset >= job.hi:
                        return out
                    if offset >= job.lo:
                        out.append(msg)
                    if offset == job.hi - 1:
                        return out
            raise DeadLetterError(f"re-reading {tp} [{job.lo}, {job.hi}) timed out")
        finally:
            with contextlib.suppress(KafkaException):
                self.consumer.unassign()

    def depth(self) -> tuple[int, int | None]:
        """Records kept on the dead-letter topic (every partition), and the timestamp (ms)
        of the oldest first record of a partition (None: nothing kept). Raises
        KafkaException."""
        metadata = self.consumer.list_topics(self.topic, timeout=10)
        described = metadata.topics.get(self.topic)
        if described is None or described.error is not None:
            return 0, None
        records, oldest = 0, None
        for p in sorted(described.partitions):
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=10
            )
            if high <= low:
                continue
            records += high - low
            first = self._first(p, low)
            if first is not None:
                oldest = first if oldest is None else min(oldest, first)
        return records, oldest

    def _first(self, partition: int, low: int) -> int | None:
        """The timestamp of the first record at or above ``low`` (None: none in time)."""
        self.consumer.assign([TopicPartition(self.topic, partition, low)])
        try:
            for msg in self.consumer.consume(1, 5.0):
                if msg.error() is None:
                    return msg.timestamp()[1]
            return None
        finally:
            with contextlib.suppress(KafkaException):
                self.consumer.unassign()

    def close(self) -> None:
        self.producer.flush(self.timeout)
        self.consumer.close()


class DeadLetters:
    """asyncio side: each given-up range is written by one worker thread, retried while
    ``holds(tp, epoch)``; ``done(tp, epoch, lo, hi)`` is called once Kafka acked it (the
    parked records may be acked and committed past)."""

    def __init__(
        self,
        writer: DeadLetterWriter,
        holds: Callable[[TP, int], bool],
        done: Callable[[TP, int, int, int], None],
        on_written: Callable[[int], None] = lambda _records: None,
        backoff_max: float = 10.0,
    ) -> None:
        self.writer = writer
        self._holds = holds
        self._done = done
        self.on_written = on_written
        self._backoff_max = backoff_max
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dead-letter")
        self._tasks = TaskSet("dead-letter write failed")

    @property
    def topic(self) -> str:
        return self.writer.topic

    def retarget(self, topic: str) -> None:
        """The group's dead-letter topic is now ``topic`` (its config changed, or was
        first read): records written from now on go there; it is created at once."""
        if topic != self.writer.topic:
            log.info("dead-letter topic", dead_letter_topic=topic, before=self.writer.topic)
        self.writer.topic = topic
        future = asyncio.get_running_loop().run_in_executor(self._pool, self.writer.ensure_topic)
        future.add_done_callback(_log_failure)

    def submit(self, job: DeadLetterJob) -> None:
        self._tasks.spawn(self._run(job), name="dead-letter")

    async def _run(self, job: DeadLetterJob) -> None:
        backoff = 0.2
        loop = asyncio.get_running_loop()
        while self._holds(job.tp, job.epoch):
            try:
                written = await loop.run_in_executor(self._pool, self.writer.write, job)
            except (DeadLetterError, KafkaException) as exc:
                log.warning(
                    "dead-letter produce failed; retrying while the lease lasts",
                    topic=job.tp.topic,
                    partition=job.tp.partition,
                    from_offset=job.lo,
                    to_offset=job.hi,
                    error=str(exc),
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_max)
                continue
            log.warning(
                "records dead-lettered",
                topic=job.tp.topic,
                partition=job.tp.partition,
                from_offset=job.lo,
                to_offset=job.hi,
                records=written,
                dead_letter_topic=self.topic,
            )
            self.on_written(written)
            self._done(job.tp, job.epoch, job.lo, job.hi)
            return
        log.info(
            "dead-lettering dropped: the lease is gone, the next holder delivers the records again",
            topic=job.tp.topic,
            partition=job.tp.partition,
            from_offset=job.lo,
            to_offset=job.hi,
        )

    async def watch_depth(
        self, interval: float, on_depth: Callable[[int, int | None], None]
    ) -> None:
        """Every ``interval`` s: what the dead-letter topic keeps (metrics)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                records, oldest = await loop.run_in_executor(self._pool, self.writer.depth)
                on_depth(records, oldest)
            except KafkaException as exc:
                log.info("dead-letter topic depth not read", error=str(exc))
            await asyncio.sleep(interval)

    async def close(self) -> None:
        await self._tasks.cancel_all()
        await asyncio.get_running_loop().run_in_executor(self._pool, self.writer.close)
        self._pool.shutdown()
