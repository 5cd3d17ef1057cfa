"""The application's client for the mesh: bind, fetch, ack — and never handle a move.

    with DsClient("demo", client_id="billing-1") as client:
        for batch in client.stream():
            process(batch)
            client.ack(batch)

A client serves one group (given to the constructor), so ``stream()`` takes no group.
``stream()`` long-polls ``Fetch`` by default; ``use_stream_rpc=True`` (constructor or
``stream()`` argument) reads over the credit-based ``Stream`` RPC instead: one stream per
bound sidecar, ``max_records`` of credit each, credit returned as the application takes
each batch, and ``ack()`` sent on the stream that delivered the records (falling back to
the ``Ack`` RPC if that stream broke). ``auto_ack=True`` acks at delivery in both modes.

Records arrive as ``RecordBatch`` columns (``DELIVERY_FORMAT_BATCHES``) and are handed to the
application as :class:`DsRecord` tuples (``topic``, ``partition``, ``offset``, ``key``,
``value``, ``timestamp_ms``, ``headers``, ``lease_epoch``; a Kafka null key or value is
``None``) in a :class:`Batch` — an immutable sequence that builds each record as it is read
and remembers the offset ranges it came in, so ``ack(batch)`` sends one range ack per
partition run instead of one ack per record. Acking any other collection of records (a
subset, several batches) works too: the client groups it into runs of consecutive offsets.
A sidecar answers an ack once it is committed; ``ack_nowait(batch)`` sends it from a
background thread, in order, and returns a future, so the next ``fetch()`` travels while
the sidecar commits; the acks that queue up meanwhile go together as the next ack (one
commit). ``close()`` waits for the acks still on their way.

Fetch and Stream responses are read without building their protobuf messages
(``wire.parse_batches``): keys and values are cut from the received bytes directly.

The client binds through the assigner, keeps a ``WatchBinding`` stream open on a
background thread (new bindings are pushed the moment a sidecar leaves), and retries
``UNAVAILABLE`` on its own (AIP-194: only that code). Acks go back to the sidecar that
delivered the record, tagged with the record's lease epoch.

Assigner failover (ARCHITECTURE §3 "Leaders"): a follower answers ``FAILED_PRECONDITION``
with the leader's address in trailing metadata ``ds-leader``; the client switches to it and
retries at once. Given ``consul=HOST:PORT``, the client also finds the leader in Consul's
KV (instead of trusting ``assigner``) and follows it with blocking queries on a background
thread, so a dead leader is left the moment a standby takes the lock. Sidecars stay up
during a failover: the client keeps fetching from them while it re-binds on the new leader.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
import uuid
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, pairwise, repeat
from operator import add, attrgetter, ne, or_
from types import TracebackType
from typing import Any, TypeVar, overload

import grpc
import structlog
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.records import wire
from services.records.batches import Columns, DsRecord, from_record
from services.runtime.errors import LEADER_METADATA_KEY, Reason, error_info, trailing_value
from services.runtime.grpcserver import CHANNEL_OPTIONS
from services.runtime.leader_watch import DEFAULT_LEADER_KEY, LeaderWatchThread

log = structlog.get_logger(__name__)

Record = DsRecord
T = TypeVar("T")

# After a leader change, a binding without sidecars is the new leader still gathering its
# sidecars' re-joins: keep using the old ones this long rather than stop fetching.
EMPTY_BINDING_GRACE_SECONDS = 10.0


# How long ack() waits for a Stream's ack_result before falling back to the Ack RPC.
STREAM_ACK_TIMEOUT_SECONDS = 10.0


class ClientError(Exception):
    """A call failed with a status the client must not retry (bad request, unknown group)."""


@dataclass(frozen=True)
class _Span:
    """Records of one partition delivered together: acked with one RangeAck."""

    topic: str
    partition: int
    lease_epoch: int
    from_offset: int
    to_offset: int  # one past the last record's offset
    count: int

    def range_ack(self) -> stream_pb2.RangeAck:
        return stream_pb2.RangeAck(
            topic=self.topic,
            partition=self.partition,
            lease_epoch=self.lease_epoch,
            from_offset=self.from_offset,
            to_offset=self.to_offset,
        )


class Batch(Sequence[DsRecord]):
    """The records of one fetch (or of what one Stream delivered): an immutable sequence
    that knows the offset ranges it was delivered in, so acking it whole costs one range
    ack per partition run. It holds the records as columns and builds each DsRecord as it
    is read (see :class:`~services.records.batches.Columns`); ``list(batch)``
    gives a plain list. Compares equal to a list of the same records."""

    __slots__ = ("_ends", "_parts", "spans")

    def __init__(
        self,
        parts: Iterable[Columns | Sequence[DsRecord]] = (),
        spans: Iterable[_Span] = (),
    ) -> None:
        self._parts = [p for p in parts if len(p)]
        self._ends = list(accumulate(map(len, self._parts)))
        self.spans = tuple(spans)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[DsRecord]:
        return chain.from_iterable(
            p.records() if isinstance(p, Columns) else iter(p) for p in self._parts
        )

    @overload
    def __getitem__(self, index: int) -> DsRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[DsRecord]: ...

    def __getitem__(self, index: int | slice) -> DsRecord | list[DsRecord]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("batch index out of range")
        k = bisect_right(self._ends, index)
        part = self._parts[k]
        local = index - (self._ends[k - 1] if k else 0)
        return part.record(local) if isinstance(part, Columns) else part[local]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Batch | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Batch({list(self)!r})"


def decode_batches(batches: Iterable[stream_pb2.RecordBatch]) -> Batch:
    """RecordBatch messages as one Batch."""
    return _batch_of(map(Columns.of, batches))


def _batch_of(decoded: Iterable[Columns]) -> Batch:
    parts = []
    spans = []
    for columns in decoded:
        if not len(columns):
            continue
        parts.append(columns)
        offsets = columns.offsets
        spans.append(
            _Span(
                columns.topic,
                columns.partition,
                columns.lease_epoch,
                offsets[0],
                offsets[-1] + 1,
                len(offsets),
            )
        )
    return Batch(parts, spans)


_ACK_KEY = attrgetter("topic", "partition", "lease_epoch")
_OFFSET = attrgetter("offset")


def spans_of(records: Sequence[Any]) -> list[_Span]:
    """Records (DsRecord or Record messages) as runs of consecutive offsets of one
    partition and epoch, in the order given: what one RangeAck each may acknowledge."""
    if isinstance(records, Batch):
        return list(records.spans)
    n = len(records)
    if n == 0:
        return []
    keys = list(map(_ACK_KEY, records))
    offsets = list(map(_OFFSET, records))
    followers = map(add, offsets, repeat(1))
    breaks = map(or_, map(ne, keys[1:], keys[:-1]), map(ne, offsets[1:], followers))
    bounds = [0, *compress(range(1, n), breaks), n]
    return [
        _Span(*keys[lo], offsets[lo], offsets[hi - 1] + 1, hi - lo) for lo, hi in pairwise(bounds)
    ]


# A range ack's identity, the same on a _Span and on a RangeAck message.
_RANGE_KEY = attrgetter("topic", "partition", "lease_epoch", "from_offset", "to_offset")


def _accepted_spans(
    spans: Sequence[_Span], rejected: Iterable[stream_pb2.RejectedRangeAck]
) -> list[bool]:
    """For each of ``spans`` (range acks sent in this order), whether it was accepted: a
    refused range is matched to the first span sent with its key not yet matched."""
    refused = Counter(_RANGE_KEY(r.ack) for r in rejected)
    out = []
    for key in map(_RANGE_KEY, spans):
        out.append(refused[key] <= 0)
        refused[key] -= 1
    return out


def _counted(spans: Sequence[_Span], accepted: Sequence[bool]) -> int:
    return sum(span.count for span, ok in zip(spans, accepted, strict=True) if ok)


# Range acks in one coalesced ack_nowait send at most (the sidecar takes 100,000 a message).
MAX_COALESCED_SPANS = 10_000


class _Acker:
    """``ack_nowait``'s thread: sends the acks queued since its last send as one ack (one
    commit on each sidecar, however many batches queued up meanwhile), in the order of
    the calls, and resolves each call's future with its own records' count.

    Without coalescing, a client that acks faster than a commit takes queued one commit
    per batch, and its acks fell further behind its reads the longer it ran."""

    def __init__(self, send: Callable[[list[_Span]], list[bool]]) -> None:
        self._send = send
        self._queue: queue.SimpleQueue[tuple[list[_Span], Future[int]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ds-ack", daemon=True)
        self._thread.start()

    def submit(self, spans: list[_Span]) -> Future[int]:
        future: Future[int] = Future()
        self._queue.put((spans, future))
        return future

    def close(self) -> None:
        """Returns once every ack submitted before it has its answer."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            queued = len(first[0])
            while queued < MAX_COALESCED_SPANS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True  # send what was queued before close(), then stop
                    break
                items.append(item)
                queued += len(item[0])
            self._answer(items)

    def _answer(self, items: list[tuple[list[_Span], Future[int]]]) -> None:
        spans = [span for item_spans, _ in items for span in item_spans]
        try:
            accepted = self._send(spans)
        except BaseException as exc:  # every caller waiting gets the failure
            for _, future in items:
                future.set_exception(exc)
            return
        start = 0
        for item_spans, future in items:
            end = start + len(item_spans)
            future.set_result(_counted(item_spans, accepted[start:end]))
            start = end


_SERVICE = f"/{stream_pb2.DESCRIPTOR.services_by_name['StreamService'].full_name}/"


def _fetched(data: bytes) -> Batch:
    """A Fetch response as a Batch: its RecordBatches read in place (``wire.py``), anything
    else (an older sidecar's Record messages, headers) parsed by protobuf."""
    columns = wire.parse_batches(data)
    if columns is None:
        return _received(stream_pb2.FetchResponse.FromString(data))
    return _batch_of(columns)


def _streamed(data: bytes) -> Batch | stream_pb2.StreamResponse:
    """A Stream response: a batch as a Batch (read like :func:`_fetched`), an ack result
    as its message."""
    columns = wire.parse_stream_batch(data)
    if columns is None:
        return stream_pb2.StreamResponse.FromString(data)
    return _batch_of(columns)


@dataclass
class _Sidecar:
    address: str
    channel: grpc.Channel
    stub: stream_pb2_grpc.StreamServiceStub
    partitions: set[tuple[str, int]] = field(default_factory=set)
    # Fetch and Stream with responses read by _fetched and _streamed.
    fetch: grpc.UnaryUnaryMultiCallable[stream_pb2.FetchRequest, Batch] = field(init=False)
    stream: grpc.StreamStreamMultiCallable[
        stream_pb2.StreamRequest, Batch | stream_pb2.StreamResponse
    ] = field(init=False)

    def __post_init__(self) -> None:
        self.fetch = self.channel.unary_unary(
            _SERVICE + "Fetch",
            request_serializer=stream_pb2.FetchRequest.SerializeToString,
            response_deserializer=_fetched,
        )
        self.stream = self.channel.stream_stream(
            _SERVICE + "Stream",
            request_serializer=stream_pb2.StreamRequest.SerializeToString,
            response_deserializer=_streamed,
        )


class _SidecarStream:
    """One ``Stream`` call to one sidecar, on its own thread, re-opened while the sidecar is
    bound. Batches go to ``out``; ack results resolve the futures of :meth:`ack` in order."""

    def __init__(
        self,
        client: DsClient,
        sidecar: _Sidecar,
        window: int,
        out: queue.Queue[tuple[_SidecarStream, Batch | ClientError]],
    ) -> None:
        self.client = client
        self.sidecar = sidecar
        self.address = sidecar.address
        self.window = window
        self.out = out
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] | None = None
        self._pending: deque[Future[stream_pb2.StreamAckResult]] = deque()
        self._call: grpc.Call | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-stream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            requests, call = self._requests, self._call
        if requests is not None:
            requests.put(None)
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]

    def grant(self, records: int) -> None:
        with self._lock:
            if self._requests is not None:
                credit = stream_pb2.StreamCredit(records=records)
                self._requests.put(stream_pb2.StreamRequest(credit=credit))

    def ack(self, spans: list[_Span], timeout: float) -> list[bool] | None:
        """Range acks sent on the stream: whether each was accepted, or None if the stream
        could not answer (not open, broken, slow) and the caller should use the Ack RPC."""
        future: Future[stream_pb2.StreamAckResult] = Future()
        acks = stream_pb2.StreamAcks(ranges=[s.range_ack() for s in spans])
        with self._lock:
            if self._requests is None:
                return None
            self._pending.append(future)
            self._requests.put(stream_pb2.StreamRequest(acks=acks))
        try:
            result = future.result(timeout=timeout)
        except Exception:
            return None
        return _accepted_spans(spans, result.rejected_ranges)

    def _request_iterator(
        self, requests: queue.SimpleQueue[stream_pb2.StreamRequest | None]
    ) -> Iterator[stream_pb2.StreamRequest]:
        yield stream_pb2.StreamRequest(
            open=stream_pb2.StreamOpen(
                client_id=self.client.client_id,
                group=self.client.group,
                auto_ack=self.client.auto_ack,
                initial_credit=stream_pb2.StreamCredit(records=self.window),
                format=stream_pb2.DELIVERY_FORMAT_BATCHES,
            )
        )
        while (request := requests.get()) is not None:
            yield request

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopped.is_set():
            requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()
            try:
                call = self.sidecar.stream(self._request_iterator(requests))
            except ValueError:  # the channel was closed (unbound, or the client closed)
                return
            with self._lock:
                self._requests, self._call = requests, call
            try:
                for response in call:
                    if isinstance(response, Batch):
                        self.out.put((self, response))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "batch":
                        self.out.put((self, _received(response.batch)))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "ack_result":
                        with self._lock:
                            future = self._pending.popleft() if self._pending else None
                        if future is not None:
                            future.set_result(response.ack_result)
                error: grpc.RpcError | None = None
            except grpc.RpcError as err:
                error = err
            except ValueError:  # the channel was closed (unbound, or the client closed)
                error = None
                self._stopped.set()
            finally:
                with self._lock:
                    self._requests, self._call = None, None
                    pending, self._pending = self._pending, deque()
                requests.put(None)
                for future in pending:
                    future.set_exception(ConnectionError("stream ended"))
            if self._stopped.is_set():
                return
            if error is not None and error.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                self.out.put(
                    (
                        self,
                        ClientError(
                            f"Stream from {self.address}: {error.code().name}: {error.details()}"
                        ),
                    )
                )
                return
            # The sidecar is going or the stream broke: re-open while it is still bound.
            self._stopped.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 2.0)


def _joined(batches: list[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    return Batch(
        [part for b in batches for part in b._parts], [span for b in batches for span in b.spans]
    )


def _received(message: stream_pb2.FetchResponse | stream_pb2.StreamBatch) -> Batch:
    """The records of a Fetch response or Stream batch; Record messages (a sidecar that
    predates DELIVERY_FORMAT_BATCHES) are converted one by one."""
    if message.batches or not message.records:
        return decode_batches(message.batches)
    records = [from_record(r) for r in message.records]
    return Batch([records], spans_of(records))


class DsClient:
    def __init__(
        self,
        group: str,
        *,
        client_id: str | None = None,
        assigner: str = "127.0.0.1:7070",
        auto_ack: bool = False,
        max_wait: float = 0.5,
        call_timeout: float = 35.0,
        consul: str | None = None,
        leader_key: str = DEFAULT_LEADER_KEY,
        use_stream_rpc: bool = False,
    ) -> None:
        self.group = group
        self.use_stream_rpc = use_stream_rpc
        self._streams: dict[str, _SidecarStream] = {}  # address → open Stream (stream RPC)
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self._leader_watch: LeaderWatchThread | None = None
        if consul:
            self._leader_watch = LeaderWatchThread(consul, self._on_leader, key=leader_key)
            assigner = self._leader_watch.current() or assigner
        self.assigner = assigner
        self.auto_ack = auto_ack
        self.max_wait = max_wait
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._sidecars: dict[str, _Sidecar] = {}
        self._binding_version = 0
        self._cursor = 0
        self._delivered_by: dict[tuple[str, int], str] = {}  # partition → sidecar address
        self._closed = threading.Event()
        self._changed = threading.Event()
        # ack_nowait(): one thread, so a client's acks reach the sidecars in the order given;
        # started on first use, drained by close().
        self._acker: _Acker | None = None
        self._acker_lock = threading.Lock()
        self._acks_closed = False
        self._assigner_lock = threading.Lock()
        self._wake_watch = threading.Event()  # close() or a leader change
        self._watch_call: grpc.Call | None = None
        self._leader_changed_at: float | None = None
        self._assigner_channel = grpc.insecure_channel(assigner, options=CHANNEL_OPTIONS)
        self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
        self._watched_assigner = self.assigner
        self._apply_binding(self._call_assigner(self._bind))
        self._watcher = threading.Thread(target=self._watch, name="ds-binding-watch", daemon=True)
        self._watcher.start()
        if self._leader_watch is not None:
            self._leader_watch.start()

    # ---- public API -------------------------------------------------------------------

    def fetch(
        self, max_records: int = 500, max_wait: float | None = None, max_bytes: int = 0
    ) -> Batch:
        """Records from any sidecar of the group; empty if none arrived within max_wait.
        ``max_bytes`` bounds the batch's keys and values (0 = the sidecar's default)."""
        wait = self.max_wait if max_wait is None else max_wait
        deadline = time.monotonic() + wait
        first_pass = True
        while not self._closed.is_set():
            sidecars = self._rotation()
            if not sidecars:
                if time.monotonic() >= deadline:
                    return Batch()
                self._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._changed.clear()
                continue
            for index, sidecar in enumerate(sidecars):
                # Sweep every sidecar without waiting; long-poll only on the last one.
                last = index == len(sidecars) - 1
                remaining = max(0.0, deadline - time.monotonic())
                poll = remaining if (last and not first_pass) or len(sidecars) == 1 else 0.0
                records = self._fetch_from(sidecar, max_records, poll, max_bytes)
                if records:
                    return records
            first_pass = False
            if time.monotonic() >= deadline:
                return Batch()
        return Batch()

    def ack(self, records: Iterable[Record]) -> int:
        """Acknowledge delivered records; returns how many the sidecars accepted. A whole
        Batch as returned goes as one range ack per partition run; other collections are
        grouped into runs of consecutive offsets."""
        spans = spans_of(records if isinstance(records, Sequence) else list(records))
        return _counted(spans, self._ack_spans(spans))

    def _ack_spans(self, spans: list[_Span]) -> list[bool]:
        """Send range acks, each to the sidecar that delivered its records (on its stream
        if one is open, else with the Ack RPC): whether each was accepted."""
        by_address: dict[str, list[int]] = {}
        for index, span in enumerate(spans):
            address = self._delivered_by.get((span.topic, span.partition))
            if address is not None:
                by_address.setdefault(address, []).append(index)
        accepted = [False] * len(spans)
        for address, indices in by_address.items():
            sent = [spans[i] for i in indices]
            with self._lock:
                sidecar = self._sidecars.get(address)
                stream = self._streams.get(address)
            answers = stream.ack(sent, STREAM_ACK_TIMEOUT_SECONDS) if stream is not None else None
            if answers is None:
                if sidecar is None:
                    continue  # the sidecar left: its new owner redelivers these records
                answers = self._ack_rpc(sidecar, sent)
            for index, ok in zip(indices, answers, strict=True):
                accepted[index] = ok
        return accepted

    def ack_nowait(self, records: Iterable[Record]) -> Future[int]:
        """Acknowledge like :meth:`ack` without waiting for the answer: the future gives
        how many records the sidecars accepted. The acks are sent in the order of the
        calls, by one background thread, so the next :meth:`fetch` travels while the
        sidecar commits this batch (commit on ack costs a broker round trip); the acks
        that queue up while one is committed go together in the next (one commit). Nothing
        is weaker than with ``ack``: a record counts as processed once the future says it
        was accepted, and an ack that fails only means redelivery. :meth:`close` waits
        for the acks still on their way."""
        spans = spans_of(records if isinstance(records, Sequence) else list(records))
        with self._acker_lock:
            if self._acks_closed:
                raise ClientError("the client is closed")
            if self._acker is None:
                self._acker = _Acker(self._ack_spans)
            return self._acker.submit(spans)

    def _ack_rpc(self, sidecar: _Sidecar, spans: list[_Span]) -> list[bool]:
        request = stream_pb2.AckRequest(
            client_id=self.client_id, group=self.group, ranges=[s.range_ack() for s in spans]
        )
        try:
            response = self._retrying(
                lambda s=sidecar, q=request: s.stub.Ack(q, timeout=10)  # type: ignore[misc]
            )
        except ClientError as err:
            info = error_info(err.__cause__) if isinstance(err.__cause__, grpc.RpcError) else None
            if info is not None and info.reason == Reason.LEASE_EPOCH_STALE.value:
                # Every ack named an old epoch: the partition moved; its records come again.
                log.info("acks for a stale lease epoch; records will be redelivered")
            else:
                log.warning("ack failed; records will be redelivered", error=str(err))
        except grpc.RpcError as err:
            log.warning("ack failed; records will be redelivered", error=str(err))
        except ValueError:
            # Its channel was closed by a binding change meanwhile: the sidecar left, and
            # the partition's next owner redelivers these records.
            log.info("ack to a sidecar that left; records will be redelivered")
        else:
            return _accepted_spans(spans, response.rejected_ranges)
        return [False] * len(spans)

    def stream(
        self, max_records: int = 500, *, use_stream_rpc: bool | None = None
    ) -> Iterator[Batch]:
        """Batches forever (until close); with auto_ack=False, ack each batch yourself.

        The group is the client's own (one client per group). ``use_stream_rpc`` (default:
        the constructor's) reads over the ``Stream`` RPC instead of long-polling ``Fetch``;
        then each bound sidecar may have up to ``max_records`` records on their way."""
        if self.use_stream_rpc if use_stream_rpc is None else use_stream_rpc:
            yield from self._stream_rpc(max_records)
            return
        while not self._closed.is_set():
            batch = self.fetch(max_records)
            if batch:
                yield batch

    def _stream_rpc(self, window: int) -> Iterator[Batch]:
        out: queue.Queue[tuple[_SidecarStream, Batch | ClientError]] = queue.Queue()
        failed: ClientError | None = None
        try:
            while not self._closed.is_set():
                if failed is not None:
                    raise failed
                self._sync_streams(out, window)
                try:
                    arrived = [out.get(timeout=0.2)]
                except queue.Empty:
                    continue
                # What arrived while the application was busy (acking, say) goes out as one
                # batch, up to the window: one ack for all of it instead of one per message.
                count = len(arrived[0][1]) if isinstance(arrived[0][1], Batch) else 0
                while count < window:
                    try:
                        arrived.append(out.get_nowait())
                    except queue.Empty:
                        break
                    count += len(arrived[-1][1]) if isinstance(arrived[-1][1], Batch) else 0
                batches: list[Batch] = []
                for stream, item in arrived:
                    if isinstance(item, ClientError):
                        failed = failed or item  # raised once what came before is handed out
                        continue
                    for span in item.spans or ():
                        self._delivered_by[(span.topic, span.partition)] = stream.address
                    # The window counts records on their way to the application: these have
                    # arrived, so the sidecar may send more while they are processed.
                    stream.grant(len(item))
                    batches.append(item)
                if batches:
                    yield _joined(batches)
        finally:
            with self._lock:
                streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                stream.stop()

    def _sync_streams(
        self,
        out: queue.Queue[tuple[_SidecarStream, Batch | ClientError]],
        window: int,
    ) -> None:
        """One Stream per bound sidecar: open new ones, end those no longer bound."""
        stopped = []
        with self._lock:
            for address in list(self._streams):
                if address not in self._sidecars:
                    stopped.append(self._streams.pop(address))
            for address, sidecar in self._sidecars.items():
                if address not in self._streams:
                    stream = _SidecarStream(self, sidecar, window, out)
                    self._streams[address] = stream
                    stream.start()
        for stream in stopped:
            stream.stop()

    def close(self) -> None:
        if self._closed.is_set():
            return
        with self._acker_lock:
            acker, self._acker, self._acks_closed = self._acker, None, True
        if acker is not None:
            acker.close()  # the acks on their way reach the sidecars first
        self._closed.set()
        self._wake_watch.set()
        if self._leader_watch is not None:
            self._leader_watch.stop()
        with contextlib.suppress(grpc.RpcError):
            self._binding_stub.Unbind(
                binding_pb2.UnbindRequest(client_id=self.client_id, group=self.group), timeout=2
            )
        self._assigner_channel.close()
        with self._lock:
            for sidecar in self._sidecars.values():
                sidecar.channel.close()
            self._sidecars.clear()

    def __enter__(self) -> DsClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def endpoints(self) -> list[str]:
        with self._lock:
            return sorted(self._sidecars)

    # ---- binding ----------------------------------------------------------------------

    def _bind(self) -> types_pb2.Binding:
        request = binding_pb2.BindRequest(client_id=self.client_id, group=self.group)
        return self._binding_stub.Bind(request, timeout=10).binding

    def _watch(self) -> None:
        backoff = 0.1
        while not self._closed.is_set():
            try:
                if self.assigner != self._watched_assigner:
                    self._rebind()
                request = binding_pb2.WatchBindingRequest(
                    client_id=self.client_id, group=self.group, known_version=self._binding_version
                )
                call = self._binding_stub.WatchBinding(request)
                self._watch_call = call
                if self.assigner != self._watched_assigner:
                    # The leader moved while we were connecting.
                    call.cancel()  # type: ignore[no-untyped-call]
                for response in call:
                    self._apply_binding(response.binding)
                    backoff = 0.1
            except (grpc.RpcError, ClientError, ValueError) as err:
                # ValueError: the channel was closed under us (a leader switch, or close()).
                if self._closed.is_set():
                    return
                if isinstance(err, grpc.RpcError):
                    self._follow_leader(err)
                log.debug("binding watch broken; re-watching", error=str(err))
            finally:
                self._watch_call = None
            if self.assigner != self._watched_assigner:
                continue  # a new leader: re-bind there at once
            self._wake_watch.wait(backoff * (0.5 + random.random()))
            self._wake_watch.clear()
            backoff = min(backoff * 2, 5.0)

    def _rebind(self) -> None:
        """Bind on a new leader. Binding versions of different leaders are not comparable
        (until assigner state is shared), so the new leader's binding replaces ours."""
        assigner = self.assigner
        binding = self._call_assigner(self._bind)
        self._watched_assigner = assigner
        with self._lock:
            self._binding_version = 0
        self._apply_binding(binding)

    def _apply_binding(self, binding: types_pb2.Binding) -> None:
        with self._lock:
            if binding.version and binding.version < self._binding_version:
                return
            moved = self._leader_changed_at
            if (
                not binding.endpoints
                and self._sidecars
                and moved is not None
                and time.monotonic() - moved < EMPTY_BINDING_GRACE_SECONDS
            ):
                # Keep fetching from the sidecars we know; the new leader pushes them
                # again as they re-join. Its version still counts, so the watch goes on.
                self._binding_version = binding.version
                return
            self._binding_version = binding.version
            wanted = {e.address: e for e in binding.endpoints}
            for address in list(self._sidecars):
                if address not in wanted:
                    self._sidecars.pop(address).channel.close()
            for address, endpoint in wanted.items():
                sidecar = self._sidecars.get(address)
                if sidecar is None:
                    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                    sidecar = _Sidecar(address, channel, stream_pb2_grpc.StreamServiceStub(channel))
                    self._sidecars[address] = sidecar
                sidecar.partitions = {(tp.topic, tp.partition) for tp in endpoint.partitions}
        log.debug("binding", version=binding.version, endpoints=sorted(wanted))
        self._changed.set()

    def _follow_leader(self, err: grpc.RpcError) -> bool:
        """Switch to the leader a follower named; True if there was one to switch to."""
        leader = trailing_value(err, LEADER_METADATA_KEY)
        if leader:
            self._switch_assigner(leader)
            return True
        return False

    def _on_leader(self, leader: str | None) -> None:
        """The Consul leader watch saw a new leader (runs on the watch thread)."""
        if leader:
            self._switch_assigner(leader)

    def _switch_assigner(self, leader: str) -> None:
        with self._assigner_lock:
            if leader == self.assigner or self._closed.is_set():
                return
            log.info("following the assigner leader", leader=leader, old=self.assigner)
            old = self._assigner_channel
            self._assigner_channel = grpc.insecure_channel(leader, options=CHANNEL_OPTIONS)
            self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
            self.assigner = leader
            self._leader_changed_at = time.monotonic()
            call = self._watch_call
        if call is not None:
            # The watch thread re-binds on the new leader at once.
            call.cancel()  # type: ignore[no-untyped-call]
        self._wake_watch.set()
        old.close()

    def _leader_from_consul(self) -> None:
        """Read the leader key now (after an assigner call failed)."""
        if self._leader_watch is None:
            return
        with contextlib.suppress(Exception):
            if leader := self._leader_watch.current():
                self._switch_assigner(leader)

    # ---- calls ------------------------------------------------------------------------

    def _rotation(self) -> list[_Sidecar]:
        with self._lock:
            sidecars = [self._sidecars[a] for a in sorted(self._sidecars)]
        if not sidecars:
            return []
        self._cursor = (self._cursor + 1) % len(sidecars)
        return sidecars[self._cursor :] + sidecars[: self._cursor]

    def _fetch_from(
        self, sidecar: _Sidecar, max_records: int, wait: float, max_bytes: int = 0
    ) -> Batch:
        max_wait = duration_pb2.Duration()
        max_wait.FromNanoseconds(int(wait * 1e9))
        request = stream_pb2.FetchRequest(
            client_id=self.client_id,
            group=self.group,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait=max_wait,
            auto_ack=self.auto_ack,
            format=stream_pb2.DELIVERY_FORMAT_BATCHES,
        )
        try:
            batch: Batch = sidecar.fetch(request, timeout=wait + self.call_timeout)
        except ValueError:
            # A binding change closed this sidecar's channel while we were about to call it
            # (another thread): it is gone; fetch from the others.
            return Batch()
        except grpc.RpcError as err:
            if err.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            ):
                # The sidecar is gone or going: the assigner pushes a new binding.
                log.debug("sidecar unavailable; waiting for a new binding", sidecar=sidecar.address)
                return Batch()
            raise ClientError(
                f"Fetch from {sidecar.address} failed: {err.code().name}: {err.details()}"
            ) from err
        for span in batch.spans:
            self._delivered_by[(span.topic, span.partition)] = sidecar.address
        return batch

    def _call_assigner(self, fn: Callable[[], types_pb2.Binding]) -> types_pb2.Binding:
        return self._retrying(fn, assigner=True)

    def _retrying(self, fn: Callable[[], T], attempts: int = 8, *, assigner: bool = False) -> T:
        """Retry UNAVAILABLE with jittered backoff (AIP-194), and a follower's redirect to
        the leader; any other status is the caller's problem and raises ClientError.

        ``fn`` must look the stub up when called (``self._binding_stub``), so a retry after
        a redirect goes to the new leader. For assigner calls, ``NOT_LEADER`` from a
        follower that does not know the leader yet (mid-election) is retried like
        UNAVAILABLE, and with Consul the leader key is read again before each retry."""
        backoff = 0.05
        for attempt in range(attempts):
            try:
                return fn()
            except ValueError:
                # "Cannot invoke RPC on closed channel": a leader switch replaced the
                # channel between looking the stub up and calling it. Retry on the new one.
                if self._closed.is_set() or attempt == attempts - 1:
                    raise
                continue
            except grpc.RpcError as err:
                last = attempt == attempts - 1
                if not last and self._follow_leader(err):
                    continue
                code = err.code()
                info = error_info(err)
                electing = assigner and info is not None and info.reason == Reason.NOT_LEADER.value
                if code != grpc.StatusCode.UNAVAILABLE and not electing:
                    raise ClientError(f"{code.name}: {err.details()}") from err
                if last:
                    if electing:
                        raise ClientError(f"{code.name}: {err.details()}") from err
                    raise
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
                if assigner:
                    self._leader_from_consul()
        raise AssertionError("unreachable")
