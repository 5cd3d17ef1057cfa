"""The processes of ``bench_pod_cost``: a producer at a set rate, direct consumers and
DsClient loops, each recording when every record first arrived.

Kept apart from the bench and light on imports (confluent-kafka here; DsClient only in the
process that uses it) so each process's RSS is what its own loop needs: a process started
with ``spawn`` imports the module of its target and nothing of the parent's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

if TYPE_CHECKING:
    from dsclient import Batch, ColumnBatch

PRODUCER = {"enable.idempotence": True, "linger.ms": 1}
PRODUCER_TICK = 0.001  # the producer's sleep between due checks while producing
PRODUCER_IDLE_TICK = 0.05  # and while its rate is 0
# The application's loops: fetch(1000, max_wait 0.2) or a credit of 1000, ack_nowait per
# batch (bench_sidecar's latency row).
CLIENT_RECORDS = 1_000
FETCH_WAIT = 0.2
GRPC_SUFFIX = "-grpc"  # a reader kind with it: no frame socket (ConnectionSettings.frame_socket)
STREAM_LINGER = 0.05  # "stream-linger": the Stream's linger (StreamOpen.linger), seconds
# The low-rate trade's fetch settings (a group's consumer_config in the mesh): the broker
# holds a fetch up to 50 ms for 1 MiB.
HELD_FETCHES = {"fetch.wait.max.ms": 50, "fetch.min.bytes": 1_048_576}


def records_due(elapsed: float, rate: float) -> int:
    """How many records a producer at ``rate`` records/s owes ``elapsed`` s into a phase."""
    if rate <= 0 or elapsed <= 0:
        return 0
    return int(elapsed * rate)


def stamped_value(seq: int, now_ns: int, size: int) -> bytes:
    """``seq:time_ns:`` padded with ``x`` to ``size`` bytes (longer if the stamp is)."""
    head = b"%d:%d:" % (seq, now_ns)
    return head + b"x" * max(0, size - len(head))


@dataclass
class Arrivals:
    """What one reader saw: first-arrival latency (ms) by seq, and the duplicates."""

    first_ms: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    error: str = ""

    def see(self, value: bytes, now_ns: int) -> None:
        seq, stamp, _ = value.split(b":", 2)
        s = int(seq)
        if s in self.first_ms:
            self.duplicates += 1
        else:
            self.first_ms[s] = (now_ns - int(stamp)) / 1e6


class AckChecks:
    """The reader's ``ack_nowait`` answers, each checked as soon as it (and every one before
    it) has come, so only the acks in flight are held. Holding every answer to the end, as
    the loops did, grew the application's RSS by ~1.6 KiB per batch (20 MiB a minute at 100
    records/s, a batch per record or two): the bench's bookkeeping, counted as DsClient's."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Future[int], int]] = deque()

    def add(self, future: Future[int], count: int) -> None:
        self._pending.append((future, count))
        self.settle(wait=False)

    def settle(self, wait: bool = True, timeout: float = 60.0) -> None:
        """Check the answers that have come, in order; with ``wait``, all of them."""
        while self._pending and (wait or self._pending[0][0].done()):
            future, count = self._pending.popleft()
            if future.result(timeout=timeout) != count:
                raise RuntimeError("a batch was not acked whole")

    def __len__(self) -> int:
        return len(self._pending)


@dataclass(frozen=True)
class Reader:
    """One reader process: ``kind`` "commit" | "auto" (direct) or "stream" |
    "stream-linger" | "fetch" | "columns" (DsClient, ``group`` at ``assigner``; "stream"
    and "columns" with GRPC_SUFFIX: without the frame socket)."""

    key: str
    kind: str
    bootstrap: str = ""
    topic: str = ""
    partitions: int = 0
    group: str = ""
    assigner: str = ""
    socket: str = ""  # "relay": the floor relay's Unix socket (relay_floor)

    @property
    def client_id(self) -> str:
        return f"bench-pod-{self.key}"


def record_key(seq: int, keys: int) -> bytes | None:
    """The key of record ``seq`` among ``keys`` keys (None: no key). A multiple of the
    partition count keeps each key in one partition, as Kafka's partitioner does."""
    return None if keys <= 0 else b"k%d" % (seq % keys)


def produce(bootstrap: str, topic: str, partitions: int, size: int, rate: Any, stop: Any,
            sent: Any, keys: int = 0) -> None:  # fmt: skip
    """The producer process: ``rate.value`` records/s (a new phase at each change),
    round-robin over the partitions, keyed over ``keys`` keys (0: no key);
    ``sent.value`` counts the records produced."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    seq = done = 0
    current, started = -1.0, 0.0
    while not stop.is_set():
        if rate.value != current:
            current, started, done = rate.value, time.monotonic(), seq
        due = done + records_due(time.monotonic() - started, current)
        while seq < due:
            producer.produce(topic, value=stamped_value(seq, time.time_ns(), size),
                             key=record_key(seq, keys), partition=seq % partitions)  # fmt: skip
            seq += 1
        sent.value = seq
        producer.poll(0)
        time.sleep(PRODUCER_TICK if current > 0 else PRODUCER_IDLE_TICK)
    producer.flush(10)


def read(reader: Reader, ready: Any, first: Any, stop: Any, out: Any) -> None:
    """A reader process: records every arrival until ``stop``, then puts ``(key,
    Arrivals)`` on ``out``."""
    result = Arrivals()
    try:
        if reader.kind in ("commit", "auto", "commit-held"):
            _direct(reader, result, ready, first, stop)
        elif reader.kind == "relay":
            _relayed(reader, result, ready, first, stop)
        else:
            _client(reader, result, ready, first, stop)
    except Exception as exc:  # reported by the parent
        result.error = repr(exc)
    finally:
        out.put((reader.key, result))


def _direct(reader: Reader, result: Arrivals, ready: Any, first: Any, stop: Any) -> None:
    """ "commit": poll(1.0), then what is already fetched (consume(999, 0)), a synchronous
    commit per batch (the sidecar's guarantee); "commit-held": the same with the broker
    holding its fetches (:data:`HELD_FETCHES`); "auto": poll() per record, auto-commit."""
    auto = reader.kind == "auto"
    consumer = Consumer(
        {
            "bootstrap.servers": reader.bootstrap,
            "group.id": f"bench-pod-{reader.key}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": auto,
            **(HELD_FETCHES if reader.kind == "commit-held" else {}),
        }
    )
    try:
        parts = [TopicPartition(reader.topic, p, OFFSET_END) for p in range(reader.partitions)]
        consumer.assign(parts)
        ready.set()
        while not stop.is_set():
            m = consumer.poll(1.0)
            if m is None:
                continue
            batch = [m] if auto else [m, *consumer.consume(CLIENT_RECORDS - 1, 0)]
            now = time.time_ns()
            for msg in batch:
                if msg.error() is None:
                    result.see(msg.value() or b"0:0:", now)
            if not auto:
                consumer.commit(asynchronous=False)
            first.set()
    finally:
        consumer.close()


def _relayed(reader: Reader, result: Arrivals, ready: Any, first: Any, stop: Any) -> None:
    """ "relay": the floor relay's reader (``relay_floor``), each frame acked as it came."""
    from tests.support.relay_floor import LENGTH, connect, decode, read_exactly

    sock = connect(reader.socket, stop)
    try:
        ready.set()
        while not stop.is_set():
            head = read_exactly(sock, LENGTH.size, stop)
            payload = None if head is None else read_exactly(sock, LENGTH.unpack(head)[0], stop)
            if payload is None:
                break
            now = time.time_ns()
            values = decode(payload)
            for value in values:
                result.see(value or b"0:0:", now)
            sock.sendall(LENGTH.pack(len(values)))
            first.set()
    finally:
        sock.close()


def _client(reader: Reader, result: Arrivals, ready: Any, first: Any, stop: Any) -> None:
    """DsClient: fetch() long-polls, stream() over the Stream RPC, or stream_columns();
    each batch stamped on arrival and acked with ack_nowait, every answer checked."""
    from dsclient import ColumnBatch, DsClient
    from dsclient.connection import DEFAULT_SETTINGS

    acks = AckChecks()
    # "-grpc": over the local socket, every Stream message on the gRPC call (no frame socket).
    kind = reader.kind.removesuffix(GRPC_SUFFIX)
    connection = dataclasses.replace(
        DEFAULT_SETTINGS, frame_socket=not reader.kind.endswith(GRPC_SUFFIX)
    )
    with DsClient(
        reader.group, client_id=reader.client_id, assigner=reader.assigner, connection=connection
    ) as client:

        def handle(batch: Batch | ColumnBatch) -> None:
            now = time.time_ns()
            if isinstance(batch, ColumnBatch):
                for value in batch.table.column("value").to_pylist():
                    result.see(value, now)
            else:
                for r in batch:
                    result.see(r.value or b"0:0:", now)
            acks.add(client.ack_nowait(batch), len(batch))
            first.set()

        ready.set()
        if kind == "fetch":
            while not stop.is_set():
                batch = client.fetch(max_records=CLIENT_RECORDS, max_wait=FETCH_WAIT)
                if batch:
                    handle(batch)
        else:

            def close_at_stop() -> None:
                stop.wait()
                client.close()

            closer = threading.Thread(target=close_at_stop)
            closer.start()
            batches: Iterator[Batch] | Iterator[ColumnBatch] = (
                client.stream_columns(CLIENT_RECORDS)
                if kind == "columns"
                else client.stream(
                    CLIENT_RECORDS,
                    use_stream_rpc=True,
                    linger=STREAM_LINGER if kind == "stream-linger" else 0.0,
                )
            )
            for streamed in batches:
                handle(streamed)
                if stop.is_set():
                    break
            closer.join()
        acks.settle()
