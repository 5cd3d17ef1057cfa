"""Count every record end to end: a steady sequence-numbered producer and a consumer loop.

``SeqProducer`` produces records keyed by a sequence number (key = seq, value carries seq)
at a steady rate on a background thread, spreading them round-robin over the partitions,
and remembers which sequences Kafka confirmed. ``ConsumerLoop`` fetches through a
:class:`DsClient` and acks each batch synchronously right after the fetch, like a plain
application would, recording every delivery (partition, offset, seq, epoch, sidecar) and
whether its ack was accepted. :class:`Tally` answers "what was lost, what came twice".
Failure tests (CONVENTIONS "Tests") check these counts, never a sample.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from dsclient import DsClient, DsRecord


def value_of(seq: int) -> bytes:
    return f"seq-{seq}".encode()


def seq_of(record: DsRecord) -> int:
    """The sequence number a :class:`SeqProducer` record carries in its key."""
    assert record.key is not None, f"record without a key at {record.partition}:{record.offset}"
    return int(record.key.decode())


class SeqProducer:
    """Produces ``rate`` records/s, seq 0, 1, 2, … to ``topic`` (partition = seq % n); with
    ``limit``, ``limit`` records in all.

    A stuck producer is replaced: after a full Kafka outage librdkafka's idempotent producer
    once never sent again (CI, 5 Dec: 42,490 records queued, no connection attempt logged
    after the brokers were back, while every service reconnected). When nothing was
    confirmed for ``stall_seconds`` while records wait, the records still in its queue
    (never sent, so never written) are purged and produced again by a fresh producer; what
    it has in flight stays with it and is flushed at :meth:`stop`. Nothing is written twice
    by this; the re-produced records come after newer ones in their partitions."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float = 500.0,
        limit: int | None = None,
        stall_seconds: float = 30.0,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.limit = limit
        self.bootstrap = bootstrap
        self.stall_seconds = stall_seconds
        self._producer = self._new_producer()
        self._retired: list[Producer] = []  # replaced while stuck: flushed at stop()
        self._lock = threading.Lock()
        self._confirmed: set[int] = set()
        self._purged: list[int] = []  # taken from a stuck producer's queue: produced again
        self.placed: dict[int, tuple[int, int]] = {}  # seq -> (partition, offset) in Kafka
        self.failed: list[tuple[int, str]] = []
        self.sent = 0
        self.renewals = 0
        self._progress_at = time.monotonic()  # the last confirmation (or renewal)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seq-producer", daemon=True)

    def _new_producer(self) -> Producer:
        return Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )

    def start(self) -> SeqProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            if self.limit is not None:
                due = min(due, self.limit)
            while self.sent < due:
                self._produce(self.sent)
                self.sent += 1
            self._produce_purged()
            self._producer.poll(0)
            for retired in self._retired:
                retired.poll(0)
            if self._stalled():
                self._renew()
            time.sleep(0.01)

    def _produce(self, seq: int) -> None:
        self._producer.produce(
            self.topic,
            key=str(seq).encode(),
            value=value_of(seq),
            partition=seq % self.partitions,
            on_delivery=functools.partial(self._delivered, seq),
        )

    def _produce_purged(self) -> None:
        """Produce again, on the current producer, what was purged from a stuck one."""
        with self._lock:
            again, self._purged = self._purged, []
        for seq in again:
            self._produce(seq)

    def _stalled(self) -> bool:
        with self._lock:
            quiet = time.monotonic() - self._progress_at
        return quiet >= self.stall_seconds and len(self._producer) > 0

    def _renew(self) -> None:
        """Move the stuck producer's queued records to a fresh producer (their delivery
        reports say _PURGE_QUEUE; :meth:`_delivered` keeps them to produce again)."""
        stuck, self._producer = self._producer, self._new_producer()
        stuck.purge(in_queue=True, in_flight=False, blocking=False)
        stuck.poll(0)  # the purged records' reports, now
        self._retired.append(stuck)
        self.renewals += 1
        with self._lock:
            self._progress_at = time.monotonic()

    def _delivered(self, seq: int, err: KafkaError | None, _msg: Message) -> None:
        with self._lock:
            if err is None:
                self._confirmed.add(seq)
                self.placed[seq] = (int(_msg.partition() or 0), int(_msg.offset() or 0))
                self._progress_at = time.monotonic()
            elif err.code() == KafkaError._PURGE_QUEUE:
                self._purged.append(seq)  # never sent: produced again by the fresh producer
            else:
                self.failed.append((seq, str(err)))

    def stop(self) -> set[int]:
        """Stop producing, flush, and return every sequence Kafka confirmed."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._produce_purged()
        remaining = sum(p.flush(30) for p in (*self._retired, self._producer))
        assert remaining == 0, f"{remaining} records not confirmed by Kafka"
        assert not self.failed, f"produce failures: {self.failed[:5]}"
        return self.confirmed()

    def confirmed(self) -> set[int]:
        with self._lock:
            return set(self._confirmed)


@dataclass(frozen=True)
class Delivery:
    seq: int
    partition: int
    offset: int
    epoch: int
    sidecar: str  # address of the sidecar that delivered it
    fetched_at: float  # monotonic, when the fetch returned
    requested_at: float  # monotonic, before the fetch was sent
    acked: bool  # the sidecar accepted the ack of the whole batch
    acked_at: float
    client: str = ""  # the client id it was delivered to


@dataclass
class Tally:
    """Every delivery, by sequence. Thread-safe."""

    deliveries: list[Delivery] = field(default_factory=list)
    by_seq: dict[int, list[Delivery]] = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, batch: list[Delivery]) -> None:
        with self.lock:
            for d in batch:
                self.deliveries.append(d)
                self.by_seq[d.seq].append(d)

    def received(self) -> set[int]:
        with self.lock:
            return set(self.by_seq)

    def duplicates(self) -> dict[int, list[Delivery]]:
        """Sequences delivered more than once, with every delivery of each."""
        with self.lock:
            return {s: list(ds) for s, ds in self.by_seq.items() if len(ds) > 1}

    def duplicate_count(self) -> int:
        return sum(len(ds) - 1 for ds in self.duplicates().values())

    def delivery_times(self) -> list[float]:
        with self.lock:
            return sorted(d.fetched_at for d in self.deliveries)

    def longest_gap(self, start: float, end: float) -> tuple[float, float]:
        """Longest time without a delivery within [start, end]: (seconds, gap start)."""
        times = [start, *(t for t in self.delivery_times() if start <= t <= end), end]
        best, at = 0.0, start
        for a, b in itertools.pairwise(times):
            if b - a > best:
                best, at = b - a, a
        return best, at


def partition_gaps(
    tally: Tally, start: float, end: float, partitions: int | None = None
) -> dict[int, float]:
    """Per partition, the longest time without a delivery to a live client in [start, end];
    with ``partitions``, a partition with no delivery at all in it counts the whole span."""
    by_partition: dict[int, list[float]] = defaultdict(list)
    for partition in range(partitions or 0):
        by_partition[partition] = []
    with tally.lock:
        for d in tally.deliveries:
            if start <= d.fetched_at <= end:
                by_partition[d.partition].append(d.fetched_at)
    gaps = {}
    for partition, times in by_partition.items():
        points = [start, *sorted(times), end]
        gaps[partition] = max(b - a for a, b in itertools.pairwise(points))
    return gaps


class ConsumerLoop:
    """Fetch → record → ack, forever, on a thread. No error handling of its own: an
    exception escaping DsClient is recorded in :attr:`errors` and ends the loop."""

    def __init__(
        self, client: DsClient, tally: Tally, max_records: int = 500, process_seconds: float = 0.0
    ) -> None:
        self.client = client
        self.tally = tally
        self.max_records = max_records
        self.process_seconds = process_seconds  # "work" between a fetch and its ack
        self.errors: list[BaseException] = []
        self.batches = 0
        self.partial_acks = 0  # batches whose ack was not (fully) accepted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consumer-loop", daemon=True)

    def start(self) -> ConsumerLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                requested_at = time.monotonic()
                batch = self.client.fetch(self.max_records, max_wait=0.5)
                if not batch:
                    continue
                fetched_at = time.monotonic()
                if self.process_seconds:
                    time.sleep(self.process_seconds)
                first = batch[0]
                sidecar = (
                    self.client._sidecar_of(first.topic, first.partition, first.lease_epoch) or ""
                )
                accepted = self.client.ack(batch)
                acked_at = time.monotonic()
                ok = accepted == len(batch)
                if not ok:
                    self.partial_acks += 1
                self.batches += 1
                self.tally.add(
                    [
                        Delivery(
                            seq=seq_of(r),
                            partition=r.partition,
                            offset=r.offset,
                            epoch=r.lease_epoch,
                            sidecar=sidecar,
                            fetched_at=fetched_at,
                            requested_at=requested_at,
                            acked=ok,
                            acked_at=acked_at,
                            client=self.client.client_id,
                        )
                        for r in batch
                    ]
                )
                for r in batch:
                    assert r.value == value_of(seq_of(r)), "value does not match key"
        except BaseException as exc:
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def wait_received(tally: Tally, expected: set[int], timeout: float) -> set[int]:
    """Wait until every expected sequence was delivered; returns the ones still missing."""
    deadline = time.monotonic() + timeout
    missing = expected - tally.received()
    while missing and time.monotonic() < deadline:
        time.sleep(0.2)
        missing = expected - tally.received()
    return missing


def describe_missing(
    missing: set[int],
    partitions: int,
    limit: int = 10,
    *,
    producer: SeqProducer | None = None,
    tally: Tally | None = None,
) -> str:
    """What was lost, per partition; with the producer and the tally, also where each lost
    record sits in Kafka and what the client received around it (to tell a skipped fetch
    from a lost response or a lost commit)."""
    per_partition: dict[int, int] = defaultdict(int)
    for seq in missing:
        per_partition[seq % partitions] += 1
    example = sorted(missing)[:limit]
    text = f"{len(missing)} lost (per partition {dict(per_partition)}; e.g. {example})"
    if producer is None or tally is None:
        return text
    with tally.lock:
        deliveries = list(tally.deliveries)
    for seq in example[:4]:
        partition, offset = producer.placed.get(seq, (seq % partitions, -1))
        near = sorted(
            (d for d in deliveries if d.partition == partition and abs(d.offset - offset) <= 3),
            key=lambda d: (d.offset, d.fetched_at),
        )
        shown = ", ".join(
            f"{d.offset}(seq {d.seq}, epoch {d.epoch}, {d.sidecar}, acked={d.acked})" for d in near
        )
        text += (
            f"\n  seq {seq} is p{partition}@{offset} (in Kafka there: "
            f"{_read_back(producer, partition, offset)}); delivered near it: {shown or 'none'}"
        )
    return text


def _read_back(producer: SeqProducer, partition: int, offset: int) -> str:
    """The key of the record at ``offset`` read straight from Kafka (a plain assign())."""
    if offset < 0:
        return "unknown offset"
    consumer = Consumer({"bootstrap.servers": producer.bootstrap, "group.id": "ds-test-read-back"})
    try:
        consumer.assign([TopicPartition(producer.topic, partition, offset)])
        msg = consumer.poll(10)
        if msg is None:
            return "nothing within 10 s"
        if msg.error() is not None:
            return f"error {msg.error()}"
        key = msg.key()
        return f"offset {msg.offset()} key {key.decode() if key else None}"
    finally:
        consumer.close()
