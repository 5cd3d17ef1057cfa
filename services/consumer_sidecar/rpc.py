"""StreamService servicer: Fetch, Stream, Ack, ReadRange, CommitOffsets and Status.

The servicer validates requests and maps outcomes to responses and statuses. It is given a
:class:`Serving` (``serving.py``: delivery from the partition table, acks and commits of
the lease keeper, this sidecar's group and id) and the range readers, not the sidecar.

Delivery (Fetch and Stream) takes records from the one :class:`PartitionTable`, which marks
them delivered, as slices of its column chunks; each slice goes out as one ``RecordBatch``
(``DELIVERY_FORMAT_BATCHES``, what :class:`DsClient` asks for) or as one ``Record`` message
per record (the default, for clients that predate batches). RecordBatches are written to
wire bytes straight from the chunks (``dsclient/records/wire.py``), so Fetch and Stream may
answer bytes: :func:`add_to_server` registers the service with a serializer that passes
them through.

Acks (the Ack RPC and a Stream's ``acks``), one per record or one per offset range, go through
:meth:`LeaseKeeper.ack` / :meth:`LeaseKeeper.ack_range`, and are answered accepted only once
a commit covering them is durable (an ack whose commit could not be made is refused, with
why). ReadRange reads on its own consumers (``reader.py``) and never moves the group's
position; CommitOffsets commits on the fetch thread, fenced by epoch and bound to the client
ReadRange gave the records to under that epoch (``range_reads.py``): another client, or an
offset beyond what the caller was given, is refused per partition (NOT_HOLDER,
NOT_DELIVERED).

Redelivery (ARCHITECTURE §3 "Delivery"): what Fetch and Stream hand out is in flight with
its holder — the client id, and the stream it went out on (0 for Fetch) — until it is acked.
A Fetch whose response was never sent (the call cancelled: a client deadline, a closed
channel) gives its records back at once; a Stream that ends gives back what it delivered and
was not acked; ``Nack`` (and a Stream's ``nacks``) gives back the caller's records, now or
after a delay; the lease keeper gives back what passed the visibility timeout. With
``auto_ack``, records count as acked once written to the client, never before: a call that
fails delivers them again.

Stale epochs (README "Errors"): an ``Ack`` request whose every ack is refused because its
lease epoch is not the partition's current one fails as a whole with
``FAILED_PRECONDITION``/``LEASE_EPOCH_STALE`` (metadata: topic, partition, epoch,
current_epoch of the first ack or range, and how many were stale) — the client's records moved
and will be redelivered. A request with at least one other outcome answers per record
(``rejected_acks``, reason ``STALE_EPOCH``), and so do a Stream's ``ack_result`` (one
stale ack must not end a stream) and ``CommitOffsets`` (per partition, by contract).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc.aio
import structlog
from confluent_kafka import KafkaError, KafkaException
from google.protobuf import duration_pb2, message_factory
from google.protobuf.message import Message

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.reasons import DsError, Reason, invalid
from dsclient.records import wire
from dsclient.records.batches import Slice
from services.consumer_sidecar.acks import Holder
from services.consumer_sidecar.client_access import ClientMetrics, acked_records
from services.consumer_sidecar.leasing import ExplicitCommit, Problem, lease_problem
from services.consumer_sidecar.partitions import Partition
from services.consumer_sidecar.reader import (
    RangeOutOfRange,
    RangeRead,
    RangeReaders,
    RangeSpec,
    ReadStalled,
)
from services.consumer_sidecar.serving import Serving
from services.runtime.handlers import method_handler
from services.runtime.topic_partition import TP

if TYPE_CHECKING:
    from services.consumer_sidecar.shm_ring import Ring
    from services.consumer_sidecar.shm_segment import Segment

log = structlog.get_logger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")

DEFAULT_MAX_RECORDS = 500
MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_BYTES = 64 * 1024 * 1024
# What every gRPC client receives by default (Go, Java, Python, grpcurl: 4 MiB). A larger
# message is refused by the client *after* the server sent it, unseen by the server: an
# auto_ack Fetch is kept within it, and one that is not (a single larger record) is not
# acked (issue 37, finding 8).
CLIENT_RECEIVE_LIMIT = 4 * 1024 * 1024
# auto_ack's byte budget: the limit less room for what the budget estimates (framing).
AUTO_ACK_MAX_BYTES = CLIENT_RECEIVE_LIMIT - 256 * 1024
DEFAULT_MAX_WAIT = 0.5
MAX_WAIT = 30.0
MAX_ACKS = 100_000
# A Stream's answers waiting for its client (queued, or acks being committed): past this
# many the sidecar reads none of the client's messages until it has read some (issue 37,
# finding 11), so a client that sends without reading grows nothing on the sidecar.
MAX_STREAM_RESULTS = 256
# Stream: one message holds at most this much, whatever the credit (Record messages, and
# the much cheaper RecordBatch columns).
STREAM_BATCH_RECORDS = 500
STREAM_BATCH_BYTES = 1024 * 1024
STREAM_COLUMNS_RECORDS = 10_000
STREAM_COLUMNS_BYTES = 4 * 1024 * 1024
STREAM_SHARED_RECORDS = 50_000  # DELIVERY_FORMAT_ARROW_SHM: the bytes are the segment's
# ARROW_SHM: what Arrow adds to a record's key and value bytes (its offset, timestamp, and
# the offsets of its key, value and headers: 34-38 bytes measured, 1,000 records a run).
SHM_RECORD_OVERHEAD = 40
_FORMATS = (
    stream_pb2.DELIVERY_FORMAT_UNSPECIFIED,
    stream_pb2.DELIVERY_FORMAT_RECORDS,
    stream_pb2.DELIVERY_FORMAT_BATCHES,
    stream_pb2.DELIVERY_FORMAT_ARROW_SHM,
)
SHM_LOCAL_ONLY = "DELIVERY_FORMAT_ARROW_SHM is served on Stream over the local socket only"
# Stream: each waits on an event of its own, set when records were buffered or came due
# again (DataSignal), or for what its client sends; it looks again after this long only
# in case a way records become takeable does not signal (a missed signal costs this
# much, not a stall). It was 0.5 s while one event was shared and cleared by every reader.
STREAM_IDLE_SECONDS = 30.0
# ReadRange
DEFAULT_RANGE_CHUNK_BYTES = 4 * 1024 * 1024
MAX_COMMITS = 100_000
MAX_NACK_DELAY = 12 * 3600.0  # seconds, as a visibility timeout at most


@dataclass
class Credit:
    """A Stream's flow-control credit (StreamCredit semantics). Byte credit is unlimited
    until the client grants bytes for the first time; from then on it is counted. A batch
    may overdraw the byte credit (it holds at least one record); nothing more is sent until
    the client grants enough to bring it above zero again."""

    records: int = 0
    bytes: int | None = None  # None = no byte limit

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        if nbytes:
            self.bytes = nbytes if self.bytes is None else self.bytes + nbytes

    def available(self) -> bool:
        return self.records > 0 and (self.bytes is None or self.bytes > 0)

    def limits(self, max_records: int, max_bytes: int) -> tuple[int, int]:
        byte_limit = max_bytes if self.bytes is None else min(max_bytes, self.bytes)
        return min(self.records, max_records), byte_limit

    def spend(self, records: int, nbytes: int) -> None:
        self.records -= records
        if self.bytes is not None:
            self.bytes -= nbytes


@dataclass(frozen=True)
class SharedMemory:
    """Where ``DELIVERY_FORMAT_ARROW_SHM`` streams get their segments: the directory of the
    sidecar's local socket, ``capacity`` bytes each (``shm_segment.py``)."""

    directory: Path
    capacity: int


class _DataEvent(asyncio.Event):
    """A stream's data event: setting it sets the stream's ``wake`` too while ``wanted``,
    so a Stream waits for either on one event (``_wait``) instead of a task for each and
    ``asyncio.wait`` around them, at every batch (issue 34: the per-batch cost)."""

    def __init__(self, wake: asyncio.Event) -> None:
        super().__init__()
        self.wake = wake
        self.wanted = False

    def set(self) -> None:
        super().set()
        if self.wanted:
            self.wake.set()


@dataclass
class _StreamState:
    credit: Credit
    auto_ack: bool
    columns: bool  # DELIVERY_FORMAT_BATCHES
    # DELIVERY_FORMAT_ARROW_SHM: the stream's segment, and what was taken for the stream and
    # waits for room in it (delivered to the stream's holder already).
    segment: Segment | None = None
    pending: list[Slice] = field(default_factory=list)
    results: deque[stream_pb2.StreamResponse] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None  # DsError, or a bug's exception (INTERNAL)
    ended: bool = False  # the client half-closed or went away
    client_id: str = ""  # for the client-access metrics
    # The answer to the latest acks (their commit): answers go out in the order of the acks.
    answering: asyncio.Task[None] | None = None
    # Acks read whose answer is still being committed (not in ``results`` yet).
    unanswered: int = 0
    # Set when the client took answers: the request reader, stopped at MAX_STREAM_RESULTS
    # answers waiting, reads on.
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def backlog(self) -> int:
        """The answers waiting for the client: queued, or acks being committed."""
        return len(self.results) + self.unanswered

    def drained(self) -> None:
        """The client took answers (the generator resumed after yielding them)."""
        self.room.set()

    async def wait_for_room(self) -> None:
        """Return once fewer than MAX_STREAM_RESULTS answers wait for the client."""
        while True:
            self.room.clear()
            if self.backlog() < MAX_STREAM_RESULTS:
                return
            await self.room.wait()

    # Set when records can be taken (DataSignal.add_waiter): this stream's own, which sets
    # ``wake`` too while the stream waits for records (``_wait``).
    data: _DataEvent = field(init=False)

    def __post_init__(self) -> None:
        self.data = _DataEvent(self.wake)


def _validate_credit(prefix: str, credit: stream_pb2.StreamCredit) -> None:
    if credit.records < 0:
        raise invalid(f"{prefix}.records", "must be >= 0")
    if credit.bytes < 0:
        raise invalid(f"{prefix}.bytes", "must be >= 0")


def _validate_acks(field_name: str, acks: Any) -> None:
    if len(acks) > MAX_ACKS:
        raise invalid(field_name, f"at most {MAX_ACKS} per message")
    for ack in acks:
        if not ack.topic:
            raise invalid(f"{field_name}.topic", "must not be empty")
        if ack.partition < 0:
            raise invalid(f"{field_name}.partition", "must be >= 0")
        if ack.offset < 0:
            raise invalid(f"{field_name}.offset", "must be >= 0")


def _validate_ranges(field_name: str, ranges: Any) -> None:
    if len(ranges) > MAX_ACKS:
        raise invalid(field_name, f"at most {MAX_ACKS} per message")
    for ack in ranges:
        if not ack.topic:
            raise invalid(f"{field_name}.topic", "must not be empty")
        if ack.partition < 0:
            raise invalid(f"{field_name}.partition", "must be >= 0")
        if ack.from_offset < 0:
            raise invalid(f"{field_name}.from_offset", "must be >= 0")
        if ack.to_offset <= ack.from_offset:
            raise invalid(f"{field_name}.to_offset", "must be > from_offset")


def _validate_delay(field_name: str, message: Any) -> float:
    """A nack's delay in seconds (unset = 0); INVALID_ARGUMENT out of [0, 12 h]."""
    if not message.HasField("delay"):
        return 0.0
    # From the fields, not ToTimedelta(): a Duration outside timedelta's range (any int64
    # seconds may come over the wire) raised OverflowError, which the caller saw as UNKNOWN.
    delay = float(message.delay.seconds + message.delay.nanos / 1e9)
    if not 0 <= delay <= MAX_NACK_DELAY:
        raise invalid(field_name, f"must be between 0 and {MAX_NACK_DELAY:.0f} s")
    return delay


def _validate_format(field_name: str, value: int) -> int:
    """The delivery format; an unknown format is INVALID_ARGUMENT."""
    if value not in _FORMATS:
        raise invalid(field_name, f"unknown delivery format {value}")
    return value


@dataclass(frozen=True)
class _NackOutcome:
    """What one Nack request (or a Stream's ``nacks`` message) came to."""

    nacked: int
    records: int
    rejected: list[stream_pb2.RejectedAck]
    rejected_ranges: list[stream_pb2.RejectedRangeAck]


@dataclass(frozen=True)
class _AckOutcome:
    """What one Ack request (or a Stream's ``acks`` message) came to. ``touched``: each
    partition an accepted ack applied to, with its acks' version right after."""

    accepted: int
    rejected: list[stream_pb2.RejectedAck]
    rejected_ranges: list[stream_pb2.RejectedRangeAck]
    accepted_acks: list[stream_pb2.RecordAck] = field(default_factory=list)
    accepted_ranges: list[stream_pb2.RangeAck] = field(default_factory=list)
    touched: dict[TP, tuple[Partition, int]] = field(default_factory=dict)

    def refused(self, failed: dict[TP, Problem]) -> _AckOutcome:
        """The accepted acks of partitions whose commit could not be made, refused."""
        if not failed:
            return self
        rejected = list(self.rejected)
        rejected_ranges = list(self.rejected_ranges)
        acks, ranges = [], []
        for ack in self.accepted_acks:
            problem = failed.get(TP(ack.topic, ack.partition))
            if problem is None:
                acks.append(ack)
            else:
                rejected.append(
                    stream_pb2.RejectedAck(ack=ack, reason=problem[0], message=problem[1])
                )
        for rack in self.accepted_ranges:
            problem = failed.get(TP(rack.topic, rack.partition))
            if problem is None:
                ranges.append(rack)
            else:
                rejected_ranges.append(
                    stream_pb2.RejectedRangeAck(ack=rack, reason=problem[0], message=problem[1])
                )
        return _AckOutcome(len(acks) + len(ranges), rejected, rejected_ranges, acks, ranges)

    def all_stale(self) -> bool:
        stale = stream_pb2.REJECT_REASON_STALE_EPOCH
        return (
            self.accepted == 0
            and bool(self.rejected or self.rejected_ranges)
            and all(r.reason == stale for r in self.rejected)
            and all(r.reason == stale for r in self.rejected_ranges)
        )


def _kafka_error(exc: KafkaException, topic: str, partition: int) -> DsError:
    error = exc.args[0] if exc.args else None
    unknown = (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    )
    if isinstance(error, KafkaError) and error.code() in unknown:
        return DsError(
            Reason.TOPIC_NOT_FOUND,
            f"{topic}[{partition}] does not exist in Kafka",
            metadata={"topic": topic, "partition": str(partition)},
        )
    return DsError(Reason.KAFKA_UNAVAILABLE, f"kafka: {exc}")


def _serialize(response: Message | bytes) -> bytes:
    """A response message, or one already encoded (``wire.py``), as wire bytes."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_to_server(servicer: StreamServicer, server: grpc.aio.Server) -> None:
    """Register StreamService as ``stream_pb2_grpc.add_StreamServiceServicer_to_server``
    does (every method of the proto's service, by its descriptor), except that any
    response may be wire bytes already."""
    service = stream_pb2.DESCRIPTOR.services_by_name["StreamService"]
    handlers = {}
    for method in service.methods:
        handlers[method.name] = method_handler(
            getattr(servicer, method.name),
            request_streaming=method.client_streaming,
            response_streaming=method.server_streaming,
            request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=_serialize,
        )
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    # As the generated code does (grpcio >= 1.63; not in the grpc-stubs).
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]


class StreamServicer(stream_pb2_grpc.StreamServiceServicer):
    def __init__(
        self,
        serving: Serving,
        readers: RangeReaders,
        clients: ClientMetrics | None = None,
        shared_memory: SharedMemory | None = None,
    ) -> None:
        self.serving = serving
        self.readers = readers  # ReadRange's consumers and watermark queries
        self.clients = clients  # client-access metrics; None = not counted
        self.shared_memory = shared_memory  # None: DELIVERY_FORMAT_ARROW_SHM is refused
        self._stream_ids = itertools.count(1)  # a Stream's holder id (0: Fetch)

    def close(self) -> None:
        self.readers.close()

    def _check_caller(self, client_id: str, group: str) -> None:
        if not client_id:
            raise invalid("client_id", "must not be empty")
        if not group:
            raise invalid("group", "must not be empty")
        if group != self.serving.group:
            raise DsError(
                Reason.GROUP_NOT_SERVED,
                f"this sidecar serves group {self.serving.group!r}, not {group!r}",
                metadata={"group": group, "served_group": self.serving.group},
            )

    async def Fetch(  # type: ignore[override]
        self, request: stream_pb2.FetchRequest, context: Context
    ) -> stream_pb2.FetchResponse | bytes:
        self._check_caller(request.client_id, request.group)
        max_records = request.max_records or DEFAULT_MAX_RECORDS
        if not 0 < max_records <= MAX_RECORDS:
            raise invalid("max_records", f"must be between 0 and {MAX_RECORDS}")
        max_bytes = request.max_bytes or DEFAULT_MAX_BYTES
        if not 0 < max_bytes <= MAX_BYTES:
            raise invalid("max_bytes", f"must be between 0 and {MAX_BYTES}")
        max_wait = (
            request.max_wait.seconds + request.max_wait.nanos / 1e9  # not ToTimedelta(): it
            if request.HasField("max_wait")  # overflows on a Duration outside its range
            else DEFAULT_MAX_WAIT
        )
        if not 0 <= max_wait <= MAX_WAIT:
            raise invalid("max_wait", f"must be between 0 and {MAX_WAIT:.0f} s")
        delivery = _validate_format("format", request.format)
        if delivery == stream_pb2.DELIVERY_FORMAT_ARROW_SHM:
            raise invalid("format", SHM_LOCAL_ONLY)
        columns = delivery == stream_pb2.DELIVERY_FORMAT_BATCHES
        if not self.serving.has_joined():
            raise DsError(Reason.SERVICE_NOT_READY, "sidecar has not joined the assigner yet")
        holder: Holder = (request.client_id, 0)
        if request.auto_ack:
            max_bytes = min(max_bytes, AUTO_ACK_MAX_BYTES)
        deadline = time.monotonic() + max_wait
        while True:
            taken = self.serving.take(max_records, max_bytes, holder)
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                break
            self.serving.data_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.serving.data_ready.wait(), remaining)
        response: stream_pb2.FetchResponse | bytes = (
            wire.fetch_response(taken)
            if columns
            else stream_pb2.FetchResponse(records=_records(taken))
        )
        auto_ack = request.auto_ack and _fits_any_client(response)
        if taken:
            # Whether the response reaches the client is known when the call ends: only
            # then are auto_ack's records acked, and records of a call that was cancelled
            # (client deadline, closed channel) are delivered again at once. A response
            # some client may refuse unseen is not auto-acked: in flight, acked explicitly
            # or delivered again.
            done = functools.partial(self._fetch_done, taken=taken, auto_ack=auto_ack)
            context.add_done_callback(cast("grpc.aio.DoneCallback[Any, Any]", done))
        if self.clients is not None:
            self.clients.delivered(request.client_id, taken, acked=auto_ack)
        return response

    def _fetch_done(self, context: Any, *, taken: list[Slice], auto_ack: bool) -> None:
        """A Fetch that handed out ``taken`` ended: sent (auto_ack: now acked), or ended
        without its response reaching the client — cancelled before its status was sent
        (the client went away), or past the client's deadline (the client gave up on it) —
        and then its records are delivered again at once. (grpc.aio's ServicerContext has
        ``done``, ``cancelled`` and ``time_remaining``; the stubs lack some.)"""
        remaining = context.time_remaining()
        if context.cancelled() or not context.done() or (remaining is not None and remaining <= 0):
            self.serving.not_sent(taken)
        elif auto_ack:
            self.serving.written(taken)

    async def Ack(self, request: stream_pb2.AckRequest, context: Context) -> stream_pb2.AckResponse:
        self._check_caller(request.client_id, request.group)
        if not request.acks and not request.ranges:
            raise invalid("acks", "name at least one record or range")
        _validate_acks("acks", request.acks)
        _validate_ranges("ranges", request.ranges)
        outcome = self._apply_acks(request.client_id, request.acks, request.ranges)
        if outcome.all_stale():
            self._count_acks(request.client_id, request.acks, request.ranges, outcome)
            raise self._stale_epoch(outcome)
        if outcome.accepted:
            outcome = outcome.refused(await self.serving.commit_acked(outcome.touched))
        self._count_acks(request.client_id, request.acks, request.ranges, outcome)
        return stream_pb2.AckResponse(
            acked_count=outcome.accepted,
            rejected_acks=outcome.rejected,
            rejected_ranges=outcome.rejected_ranges,
        )

    def _apply_acks(self, client: str, acks: Any, ranges: Any) -> _AckOutcome:
        """Acks from ``client``: a record in flight to another client is refused to it
        (REJECT_REASON_NOT_HOLDER)."""
        rejected, accepted_acks = [], []
        for ack in acks:
            problem = self.serving.ack(ack, client)
            if problem is None:
                accepted_acks.append(ack)
            else:
                rejected.append(problem)
        rejected_ranges, accepted_ranges = [], []
        for rack in ranges:
            range_problem = self.serving.ack_range(rack, client)
            if range_problem is None:
                accepted_ranges.append(rack)
            else:
                rejected_ranges.append(range_problem)
        touched: dict[TP, tuple[Partition, int]] = {}
        for acked in (*accepted_acks, *accepted_ranges):
            tp = TP(acked.topic, acked.partition)
            part = self.serving.partition(tp)
            if tp not in touched and part is not None:
                touched[tp] = (part, part.acks.version)
        return _AckOutcome(
            len(accepted_acks) + len(accepted_ranges),
            rejected,
            rejected_ranges,
            accepted_acks,
            accepted_ranges,
            touched,
        )

    async def Nack(
        self, request: stream_pb2.NackRequest, context: Context
    ) -> stream_pb2.NackResponse:
        self._check_caller(request.client_id, request.group)
        if not request.all and not request.records and not request.ranges:
            raise invalid("records", "name at least one record or range, or set all")
        _validate_acks("records", request.records)
        _validate_ranges("ranges", request.ranges)
        delay = _validate_delay("delay", request)
        outcome = self._apply_nacks(request.client_id, request.records, request.ranges, delay)
        nacked, records = outcome.nacked, outcome.records
        if request.all:
            nacked += 1
            records += self.serving.nack_all(request.client_id, delay)
        return stream_pb2.NackResponse(
            nacked_count=nacked,
            rejected_acks=outcome.rejected,
            rejected_ranges=outcome.rejected_ranges,
            records=records,
        )

    def _apply_nacks(self, client_id: str, acks: Any, ranges: Any, delay: float) -> _NackOutcome:
        """Each named record and range of ``client_id``'s given back (after ``delay``)."""
        rejected: list[stream_pb2.RejectedAck] = []
        rejected_ranges: list[stream_pb2.RejectedRangeAck] = []
        nacked = records = 0
        for ack in acks:
            problem, count = self.serving.nack_range(
                ack.topic, ack.partition, ack.lease_epoch, ack.offset, ack.offset + 1,
                client_id, delay,
            )  # fmt: skip
            if problem is None:
                nacked, records = nacked + 1, records + count
            else:
                rejected.append(
                    stream_pb2.RejectedAck(ack=ack, reason=problem[0], message=problem[1])
                )
        for rack in ranges:
            problem, count = self.serving.nack_range(
                rack.topic, rack.partition, rack.lease_epoch, rack.from_offset, rack.to_offset,
                client_id, delay,
            )  # fmt: skip
            if problem is None:
                nacked, records = nacked + 1, records + count
            else:
                rejected_ranges.append(
                    stream_pb2.RejectedRangeAck(ack=rack, reason=problem[0], message=problem[1])
                )
        return _NackOutcome(nacked, records, rejected, rejected_ranges)

    def _count_acks(self, client_id: str, acks: Any, ranges: Any, outcome: _AckOutcome) -> None:
        if self.clients is not None:
            records = acked_records(acks, ranges, outcome.rejected, outcome.rejected_ranges)
            self.clients.acked(client_id, records)

    def _stale_epoch(self, outcome: _AckOutcome) -> DsError:
        first: stream_pb2.RecordAck | stream_pb2.RangeAck = (
            outcome.rejected[0].ack if outcome.rejected else outcome.rejected_ranges[0].ack
        )
        part = self.serving.partition(TP(first.topic, first.partition))
        current = part.epoch if part is not None else -1
        return DsError(
            Reason.LEASE_EPOCH_STALE,
            f"{first.topic}[{first.partition}]: epoch {first.lease_epoch} is not the current "
            f"epoch {current}; the records will be redelivered",
            metadata={
                "topic": first.topic,
                "partition": str(first.partition),
                "epoch": str(first.lease_epoch),
                "current_epoch": str(current),
                "stale_acks": str(len(outcome.rejected) + len(outcome.rejected_ranges)),
            },
        )

    # ---- Stream -----------------------------------------------------------------------

    async def Stream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], context: Context
    ) -> AsyncIterator[stream_pb2.StreamResponse | bytes]:
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "open":
            raise invalid("open", "the first Stream message must be open")
        opened = first.open
        self._check_caller(opened.client_id, opened.group)
        _validate_credit("open.initial_credit", opened.initial_credit)
        delivery = _validate_format("open.format", opened.format)
        shared = delivery == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        if shared and (self.shared_memory is None or not context.peer().startswith("unix:")):
            raise invalid("open.format", SHM_LOCAL_ONLY)
        if not self.serving.has_joined():
            raise DsError(Reason.SERVICE_NOT_READY, "sidecar has not joined the assigner yet")
        credit = Credit()
        credit.add(opened.initial_credit.records, opened.initial_credit.bytes)
        columns = delivery == stream_pb2.DELIVERY_FORMAT_BATCHES
        state = _StreamState(
            credit=credit, auto_ack=opened.auto_ack, columns=columns, client_id=opened.client_id
        )
        if shared:
            state.segment = await self._segment()
        if state.segment is not None:
            limits = _shared_limits(state.segment.ring.capacity)
        elif columns:
            limits = (STREAM_COLUMNS_RECORDS, STREAM_COLUMNS_BYTES)
        else:
            limits = (STREAM_BATCH_RECORDS, STREAM_BATCH_BYTES)
        holder: Holder = (opened.client_id, next(self._stream_ids))
        self.serving.data.add_waiter(state.data)
        reader = asyncio.create_task(self._read_stream(request_iterator, state))
        clients = self.clients
        client_label = clients.stream_opened(opened.client_id) if clients is not None else ""
        if clients is not None and state.segment is not None:
            clients.shared_memory(client_label, state.segment.ring.capacity)
        try:
            while True:
                state.wake.clear()
                while state.results:
                    yield state.results.popleft()
                    state.drained()
                if state.error is not None:
                    raise state.error
                if state.ended:
                    return
                if state.pending:  # ARROW_SHM: taken, waiting for room in the segment
                    response, sent = _shared_response(state)
                    if not sent:
                        await self._wait(state, data=False)  # for a release
                        continue
                    yield response
                    if state.auto_ack:
                        self.serving.written(sent)
                    continue
                if not state.credit.available():
                    await self._wait(state, data=False)
                    continue
                if state.segment is not None and not _has_room(state.segment.ring, limits):
                    # Records taken and held back for a client that holds its segment full
                    # would wait out the visibility timeout instead of going to another.
                    await self._wait(state, data=False)  # for a release
                    continue
                state.data.clear()
                taken = self.serving.take(*state.credit.limits(*limits), holder)
                if not taken:
                    await self._wait(state, data=True)
                    continue
                if clients is not None:
                    clients.delivered(opened.client_id, taken, acked=state.auto_ack)
                state.credit.spend(sum(map(len, taken)), sum(s.data_bytes() for s in taken))
                if state.segment is not None:
                    state.pending = taken  # written into the segment as it has room
                    continue
                if state.columns:
                    yield wire.stream_response(taken)
                else:
                    batch = stream_pb2.StreamBatch(records=_records(taken))
                    yield stream_pb2.StreamResponse(batch=batch)
                if state.auto_ack:  # written (the generator resumes once it was sent)
                    self.serving.written(taken)
        finally:
            # Records delivered on this stream and not acked come again now (redelivery
            # as soon as the stream that received them ends); acks on the Ack RPC still
            # count for them until they are delivered again.
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.serving.data.drop(state.data)
            if state.segment is not None:
                state.segment.close()
                if clients is not None:
                    clients.shared_memory(client_label, -state.segment.ring.capacity)
            self.serving.release(holder)
            if clients is not None:
                clients.stream_closed(client_label)

    async def _read_stream(
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], state: _StreamState
    ) -> None:
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "credit":
                    _validate_credit("credit", request.credit)
                    state.credit.add(request.credit.records, request.credit.bytes)
                elif kind == "acks":
                    _validate_acks("acks.acks", request.acks.acks)
                    _validate_ranges("acks.ranges", request.acks.ranges)
                    if len(request.acks.released) > MAX_ACKS:
                        raise invalid("acks.released", f"at most {MAX_ACKS} per message")
                    if state.segment is not None and request.acks.released:
                        state.segment.release(request.acks.released)
                    outcome = self._apply_acks(
                        state.client_id, request.acks.acks, request.acks.ranges
                    )
                    # Answered once committed, by a task of its own: credits that arrive
                    # meanwhile are not held up behind the commit's round trip.
                    state.unanswered += 1
                    state.answering = asyncio.create_task(
                        self._answer_acks(state, request.acks, outcome, state.answering)
                    )
                elif kind == "nacks":
                    nacks = request.nacks
                    _validate_acks("nacks.records", nacks.records)
                    _validate_ranges("nacks.ranges", nacks.ranges)
                    delay = _validate_delay("nacks.delay", nacks)
                    done = self._apply_nacks(state.client_id, nacks.records, nacks.ranges, delay)
                    result = stream_pb2.StreamNackResult(
                        nacked_count=done.nacked,
                        rejected_acks=done.rejected,
                        rejected_ranges=done.rejected_ranges,
                        records=done.records,
                    )
                    state.results.append(stream_pb2.StreamResponse(nack_result=result))
                elif kind == "open":
                    raise invalid("open", "a Stream is opened once")
                else:
                    raise invalid("kind", "set one of open, credit, acks, nacks")
                state.wake.set()
                # A client that sends without reading its answers: read nothing more from
                # it until it has (issue 37, finding 11); its sends wait on flow control.
                await state.wait_for_room()
        except DsError as err:
            state.error = err
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as err:  # a bug: the stream fails (INTERNAL), never ends quietly
            log.exception("stream request failed")
            state.error = err
        finally:
            if state.answering is not None:  # the answers to acks already made
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(state.answering)
            state.ended = True
            state.wake.set()

    async def _answer_acks(
        self,
        state: _StreamState,
        acks: stream_pb2.StreamAcks,
        outcome: _AckOutcome,
        previous: asyncio.Task[None] | None,
    ) -> None:
        """Commit what ``outcome`` accepted, then queue its StreamAckResult after the
        previous acks' answer (whose commit this one's may already cover); acks whose
        commit could not be made are refused. A commit that fails ends the stream with its
        status, as before an answer."""
        try:
            try:
                if outcome.accepted:
                    outcome = outcome.refused(await self.serving.commit_acked(outcome.touched))
            except DsError as err:
                state.error = state.error or err
            self._count_acks(state.client_id, acks.acks, acks.ranges, outcome)
            if previous is not None:
                await previous
            if state.error is not None:
                state.wake.set()
                return
            result = stream_pb2.StreamAckResult(
                acked_count=outcome.accepted,
                rejected_acks=outcome.rejected,
                rejected_ranges=outcome.rejected_ranges,
            )
            state.results.append(stream_pb2.StreamResponse(ack_result=result))
            state.wake.set()
        finally:
            state.unanswered -= 1
            state.room.set()  # an error ends the stream: the reader must not wait for room

    async def _segment(self) -> Segment:
        """A new stream's shared-memory segment; UNAVAILABLE if it cannot be made (the
        client reads on over TCP). Made on a thread: allocating every page takes
        milliseconds (4-12 for 32 MiB here), and the first one imports pyarrow; the event
        loop serves the other calls meanwhile. A stream that goes while its segment is
        made has it closed (its file removed) as soon as it is made."""
        assert self.shared_memory is not None
        making = asyncio.ensure_future(
            asyncio.to_thread(
                _make_segment,
                self.shared_memory.directory,
                self.serving.sidecar_id,
                self.shared_memory.capacity,
            )
        )
        try:
            return await asyncio.shield(making)
        except asyncio.CancelledError:
            making.add_done_callback(_close_made)
            raise
        except OSError as err:
            log.warning("shared-memory segment not made", error=str(err))
            raise DsError(
                Reason.SERVICE_NOT_READY, f"cannot make a shared-memory segment: {err}"
            ) from err

    async def _wait(self, state: _StreamState, *, data: bool) -> None:
        """Until the client sent something, or (with ``data``) records were buffered: one
        wait on ``state.wake``, which the data event sets too while it is wanted."""
        if data:
            if state.data.is_set():
                return
            state.data.wanted = True
        try:
            async with asyncio.timeout(STREAM_IDLE_SECONDS):
                await state.wake.wait()
        except TimeoutError:
            pass
        finally:
            state.data.wanted = False

    # ---- ReadRange --------------------------------------------------------------------

    async def ReadRange(
        self, request: stream_pb2.ReadRangeRequest, context: Context
    ) -> AsyncIterator[stream_pb2.ReadRangeResponse]:
        self._check_caller(request.client_id, request.group)
        tp, max_bytes = self._validate_range(request)
        part = self._held(tp)
        epoch = part.epoch
        if request.to_offset == request.from_offset:
            yield stream_pb2.ReadRangeResponse(lease_epoch=epoch, next_offset=request.to_offset)
            return
        spec = RangeSpec(
            tp,
            request.from_offset,
            request.to_offset,
            max_bytes,
            epoch,
            arrow=request.format == stream_pb2.READ_FORMAT_ARROW_IPC,
        )
        reserved = self._reserve_read(max_bytes)
        try:
            read = await self._open(spec, request)
            start = request.from_offset  # where the next chunk's records begin
            try:
                while True:
                    chunk = await self._kafka(read.next_chunk, request=request)
                    if chunk is None:
                        raise DsError(Reason.SERVICE_NOT_READY, "the range read was stopped")
                    self._held(tp, epoch)  # every chunk is read under the live lease
                    if self.clients is not None:
                        self.clients.served_records(
                            request.client_id, chunk.count, chunk.payload_bytes
                        )
                    # Counted as given once handed to gRPC: the client may commit up to here.
                    self.serving.range_given(tp, epoch, request.client_id, start, chunk.next_offset)
                    start = chunk.next_offset
                    yield stream_pb2.ReadRangeResponse(
                        records=chunk.records,
                        arrow_ipc=chunk.arrow_ipc,
                        lease_epoch=epoch,
                        next_offset=chunk.next_offset,
                    )
                    if chunk.next_offset >= request.to_offset:
                        return
            finally:
                # Never blocks the loop: a read still consuming stops within one poll.
                self.readers.executor.submit(read.close)
        finally:
            self.serving.release_read(reserved)  # done, failed or cancelled alike

    def _reserve_read(self, max_bytes: int) -> int:
        """Reserve what a stream may hold (its consumer's prefetch and one chunk) from the
        sidecar's read budget, or RESOURCE_EXHAUSTED TOO_MANY_RANGE_READS."""
        needed = self.readers.prefetch_bytes + max_bytes
        refusal = self.serving.reserve_read(needed)
        if refusal is None:
            return needed
        budget = self.serving.read_budget
        raise DsError(
            Reason.TOO_MANY_RANGE_READS,
            refusal.message,
            metadata={
                "limit": refusal.limit,
                "open_streams": str(budget.streams),
                "max_streams": str(budget.max_streams),
                "reserved_bytes": str(budget.reserved),
                "needed_bytes": str(needed),
                "budget_bytes": str(budget.max_bytes),
            },
        )

    async def _open(self, spec: RangeSpec, request: stream_pb2.ReadRangeRequest) -> RangeRead:
        """Open the range's reader. A call cancelled meanwhile closes the reader once its
        opening is done (it runs on a reader thread and cannot be interrupted), so no
        consumer outlives the stream that reserved its memory."""
        opening = asyncio.ensure_future(self._kafka(self.readers.open, spec, request=request))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._close_opened)
            raise

    def _close_opened(self, opening: asyncio.Future[RangeRead]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.readers.executor.submit(opening.result().close)

    def _validate_range(self, request: stream_pb2.ReadRangeRequest) -> tuple[TP, int]:
        if not request.topic:
            raise invalid("topic", "must not be empty")
        if request.partition < 0:
            raise invalid("partition", "must be >= 0")
        if request.from_offset < 0:
            raise invalid("from_offset", "must be >= 0")
        if request.to_offset < request.from_offset:
            raise invalid("to_offset", "must be >= from_offset")
        if request.max_bytes < 0 or request.max_bytes > MAX_BYTES:
            raise invalid("max_bytes", f"must be between 0 and {MAX_BYTES}")
        if request.format not in (
            stream_pb2.READ_FORMAT_UNSPECIFIED,
            stream_pb2.READ_FORMAT_RECORDS,
            stream_pb2.READ_FORMAT_ARROW_IPC,
        ):
            raise invalid("format", f"unknown format {request.format}")
        return TP(request.topic, request.partition), request.max_bytes or DEFAULT_RANGE_CHUNK_BYTES

    def _held(self, tp: TP, epoch: int | None = None) -> Partition:
        """The partition if this sidecar holds its live lease (at ``epoch``), else
        FAILED_PRECONDITION LEASE_NOT_HELD. The holder is not known here: ask the assigner
        (DescribeGroup) or the client's binding."""
        part = self.serving.partition(tp)
        problem = lease_problem(part, self.serving.now(), epoch)
        if problem is None and part is not None:
            return part
        reason, message = problem or (stream_pb2.REJECT_REASON_NOT_HELD, "not held")
        raise DsError(
            Reason.LEASE_NOT_HELD,
            f"{tp.topic}[{tp.partition}]: {message}",
            metadata={
                "group": self.serving.group,
                "topic": tp.topic,
                "partition": str(tp.partition),
                "sidecar_id": self.serving.sidecar_id,
                "state": stream_pb2.RejectReason.Name(reason).removeprefix("REJECT_REASON_"),
                "current_epoch": str(part.epoch if part is not None else -1),
            },
        )

    async def _kafka(
        self, fn: Callable[..., R], *args: Any, request: stream_pb2.ReadRangeRequest
    ) -> R:
        """Run blocking Kafka work on the readers' threads; its failures as statuses."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.readers.executor, fn, *args)
        except RangeOutOfRange as exc:
            raise DsError(
                Reason.OFFSET_OUT_OF_RANGE,
                f"[{request.from_offset}, {request.to_offset}) is outside "
                f"{request.topic}[{request.partition}]: {exc}",
                metadata={
                    "topic": request.topic,
                    "partition": str(request.partition),
                    "from_offset": str(request.from_offset),
                    "to_offset": str(request.to_offset),
                    "log_start_offset": str(exc.low),
                    "high_watermark": str(exc.high),
                },
            ) from exc
        except ReadStalled as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, str(exc)) from exc
        except KafkaException as exc:
            raise _kafka_error(exc, request.topic, request.partition) from exc

    # ---- CommitOffsets ----------------------------------------------------------------

    async def CommitOffsets(
        self, request: stream_pb2.CommitOffsetsRequest, context: Context
    ) -> stream_pb2.CommitOffsetsResponse:
        self._check_caller(request.client_id, request.group)
        if not request.offsets:
            raise invalid("offsets", "name at least one offset")
        if len(request.offsets) > MAX_COMMITS:
            raise invalid("offsets", f"at most {MAX_COMMITS} per call")
        seen: set[TP] = set()
        for commit in request.offsets:
            if not commit.topic:
                raise invalid("offsets.topic", "must not be empty")
            if commit.partition < 0:
                raise invalid("offsets.partition", "must be >= 0")
            if commit.offset < 0:
                raise invalid("offsets.offset", "must be >= 0")
            if commit.lease_epoch < 0:
                raise invalid("offsets.lease_epoch", "must be >= 0")
            tp = TP(commit.topic, commit.partition)
            if tp in seen:
                raise invalid("offsets", f"{tp.topic}[{tp.partition}] named twice")
            seen.add(tp)
        results: list[stream_pb2.OffsetCommitResult | None] = [None] * len(request.offsets)
        to_commit: list[tuple[int, ExplicitCommit]] = []
        for index, commit in enumerate(request.offsets):
            beyond = await self._beyond_high_watermark(commit)
            if beyond is not None:
                results[index] = stream_pb2.OffsetCommitResult(
                    commit=commit,
                    reason=stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
                    message=beyond,
                )
            else:
                tp = TP(commit.topic, commit.partition)
                to_commit.append((index, ExplicitCommit(tp, commit.offset, commit.lease_epoch)))
        outcomes = await self.serving.commit_offsets([c for _, c in to_commit], request.client_id)
        for (index, _), outcome in zip(to_commit, outcomes, strict=True):
            results[index] = stream_pb2.OffsetCommitResult(
                commit=request.offsets[index],
                committed=outcome.committed,
                reason=outcome.reason,
                message=outcome.message,
            )
        return stream_pb2.CommitOffsetsResponse(results=[r for r in results if r is not None])

    async def _beyond_high_watermark(self, commit: stream_pb2.OffsetCommit) -> str | None:
        """Why the offset is past the partition's high watermark, or None. The watermark
        from statistics may be old, so one above it is checked against Kafka itself."""
        part = self.serving.partition(TP(commit.topic, commit.partition))
        if part is None:
            return None  # refused as NOT_HELD by the keeper
        if 0 <= commit.offset <= part.high_watermark:
            return None
        loop = asyncio.get_running_loop()
        try:
            _low, high = await loop.run_in_executor(
                self.readers.executor, self.readers.watermarks, part.tp
            )
        except KafkaException as exc:
            log.info("watermark query failed; not checking the range", error=str(exc))
            return None
        if commit.offset > high:
            return f"offset {commit.offset} is beyond the high watermark {high}"
        return None

    async def Status(
        self, request: stream_pb2.StatusRequest, context: Context
    ) -> stream_pb2.StatusResponse:
        now = time.monotonic()
        partitions = []
        for part in sorted(self.serving.partitions(), key=lambda p: p.tp):
            remaining = duration_pb2.Duration()
            remaining.FromNanoseconds(int(max(0.0, part.deadline - now) * 1e9))
            partitions.append(
                stream_pb2.PartitionStatus(
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    lease_epoch=part.epoch,
                    lease_deadline_remaining=remaining,
                    position=part.position,
                    committed_offset=part.committed,
                    high_watermark=part.high_watermark,
                    buffered_records=part.buffered_records,
                    buffered_bytes=part.buffered_bytes,
                    paused=part.paused,
                    inflight=part.acks.inflight,
                    due=part.acks.due,
                )
            )
        policy = self.serving.redelivery
        visibility = duration_pb2.Duration()
        visibility.FromNanoseconds(int(policy.visibility * 1e9))
        return stream_pb2.StatusResponse(
            sidecar_id=self.serving.sidecar_id,
            group=self.serving.group,
            partitions=partitions,
            buffer_bytes=self.serving.buffered_bytes,
            buffer_cap_bytes=self.serving.buffer_cap_bytes,
            consumer_config=self.serving.consumer_config(),
            config_version=self.serving.config_version(),
            assigner_connected=self.serving.connected(),
            visibility_timeout=visibility,
            max_deliveries=policy.max_deliveries,
        )


def _shared_limits(capacity: int) -> tuple[int, int]:
    """DELIVERY_FORMAT_ARROW_SHM: the records and bytes of one take from a segment of
    ``capacity``. The response carries no record: only the segment bounds what one takes.
    A quarter of it keeps a few responses in flight, and fewer, larger partition runs (each
    costs its Arrow arrays' set-up, tens of µs; takes sized to the room left shrank as the
    client held more, and cut the runs small: 1 KiB records read at 0.5 of the direct loop
    instead of 0.7). The records limit keeps Arrow's per-record share within an eighth of
    the segment in small ones."""
    records = max(1, min(STREAM_SHARED_RECORDS, capacity // (8 * SHM_RECORD_OVERHEAD)))
    return records, max(1, capacity // 4)


def _has_room(ring: Ring, limits: tuple[int, int]) -> bool:
    """Whether a take of ``limits`` may go: Arrow adds about SHM_RECORD_OVERHEAD a record
    and 1.3 KiB a run to the keys and values, so the segment must have room for the take's
    bytes and half as much again (an empty ring always takes); what still does not fit
    waits for room, already taken."""
    nbytes = limits[1]
    return ring.room() >= min(ring.capacity, nbytes + nbytes // 2)


def _make_segment(directory: Path, sidecar_id: str, capacity: int) -> Segment:
    from services.consumer_sidecar.shm_segment import Segment  # pyarrow: on first use

    return Segment(directory, sidecar_id, capacity)


def _close_made(making: asyncio.Future[Segment]) -> None:
    """A segment made for a stream that went meanwhile: closed (its file removed)."""
    if not making.cancelled() and making.exception() is None:
        making.result().close()


def _shared_response(state: _StreamState) -> tuple[stream_pb2.StreamResponse, list[Slice]]:
    """DELIVERY_FORMAT_ARROW_SHM: the stream's pending slices written into its segment, in
    order, while it has room: the response saying where, and the slices it delivers (the
    rest stay pending). A slice too large for the whole segment goes as a RecordBatch, the
    last of its response."""
    from dsclient.records.arrow_batches import from_slice  # pyarrow: on first use

    segment = state.segment
    assert segment is not None
    batch = stream_pb2.StreamBatch()
    sent = 0
    for piece in state.pending:
        arrow = from_slice(piece)
        try:
            region = segment.write(arrow)
        except ValueError:  # larger than the segment
            batch.batches.append(piece.to_batch())
            sent += 1
            # The response ends here: a client hands out a response's shared runs, then its
            # RecordBatches, so what follows must not share a response with this one (a
            # partition's records stay in offset order).
            break
        if region is None:  # no room until the client releases
            break
        batch.shared.add(
            topic=piece.topic,
            partition=piece.partition,
            lease_epoch=piece.epoch,
            delivery_count=piece.deliveries,
            first_offset=piece.first_offset,
            last_offset=piece.last_offset,
            record_count=len(piece),
            segment=segment.name,
            position=region.position,
            length=region.length,
            region=region.id,
        )
        sent += 1
    done, state.pending = state.pending[:sent], state.pending[sent:]
    return stream_pb2.StreamResponse(batch=batch), done


def _fits_any_client(response: stream_pb2.FetchResponse | bytes) -> bool:
    """Whether every client receives ``response`` (:data:`CLIENT_RECEIVE_LIMIT`)."""
    size = len(response) if isinstance(response, bytes) else response.ByteSize()
    if size <= CLIENT_RECEIVE_LIMIT:
        return True
    log.warning(
        "auto_ack Fetch response larger than clients accept by default: not acked",
        bytes=size,
        limit=CLIENT_RECEIVE_LIMIT,
    )
    return False


def _records(slices: list[Slice]) -> list[Any]:
    """DELIVERY_FORMAT_RECORDS: one Record message per record."""
    return [record for s in slices for record in s.to_records()]
