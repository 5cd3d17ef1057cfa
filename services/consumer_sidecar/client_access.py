"""Client-access metrics: what each application client (``client_id``) asks of the
sidecar and receives (ARCHITECTURE §5.3).

Kept per client in plain Python state rendered at scrape time (:class:`ClientMetrics`):
cheap to update on the delivery path, and an evicted client's series go away whole.
``client_id`` cardinality is bounded by :class:`ClientIdLimiter`: past the limit a new id is
reported as ``other``, unless the least recently seen client has been idle long enough to
give up its place. :class:`AccessInterceptor` counts every StreamService call (and by
transport: the pod's Unix domain socket or TCP).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dsclient.reasons import DsError
from services.consumer_sidecar.metric_table import (
    AGE_BUCKETS,
    REQUEST_BUCKETS,
    SPECS,
    Buckets,
    base_name,
    help_of,
)
from services.runtime.handlers import Behavior, WrappingInterceptor

if TYPE_CHECKING:
    from dsclient.records.batches import Slice

OTHER_CLIENT = "other"
UNKNOWN_CLIENT = "unknown"  # a request without a client_id (Status; an invalid request)
SERVICE_PREFIX = "/dataservice.sidecar.v1.StreamService/"


class ClientIdLimiter:
    """Bounded ``client_id`` label values (LRU by last use).

    A known id keeps its label. A new id gets one while fewer than ``limit`` are tracked;
    when full, the least recently seen id gives its place up if it has been idle for
    ``idle_seconds`` and holds no open stream (its series are dropped), otherwise the new
    id is reported as :data:`OTHER_CLIENT`."""

    def __init__(self, limit: int, idle_seconds: float) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._pinned: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def resolve(self, client_id: str, now: float) -> tuple[str, str | None]:
        """(label for ``client_id``, the id evicted to make room or None)."""
        if client_id in self._seen:
            self._seen[client_id] = now
            self._seen.move_to_end(client_id)
            return client_id, None
        evicted = None
        if len(self._seen) >= self.limit:
            oldest, seen_at = next(iter(self._seen.items()), ("", now))
            if not oldest or oldest in self._pinned or now - seen_at < self.idle_seconds:
                return OTHER_CLIENT, None
            del self._seen[oldest]
            evicted = oldest
        self._seen[client_id] = now
        return client_id, evicted

    def pin(self, label: str) -> None:
        """An open stream: the client may not be evicted however idle it looks."""
        if label != OTHER_CLIENT:
            self._pinned[label] = self._pinned.get(label, 0) + 1

    def unpin(self, label: str) -> None:
        left = self._pinned.get(label, 0) - 1
        if left > 0:
            self._pinned[label] = left
        else:
            self._pinned.pop(label, None)


def acked_records(
    acks: Sequence[Any],
    ranges: Sequence[Any],
    rejected: Sequence[Any],
    rejected_ranges: Sequence[Any],
) -> int:
    """Records an Ack (or a Stream's acks message) acknowledged: single acks count one,
    range acks their offset span; the rejected ones are taken off."""
    spans: int = sum(int(r.to_offset - r.from_offset) for r in ranges)
    refused: int = sum(int(r.ack.to_offset - r.ack.from_offset) for r in rejected_ranges)
    return len(acks) - len(rejected) + spans - refused


# ---- client-access metrics ----------------------------------------------------------------

# Request outcomes that are not a client's error: success, and a call the client ended
# itself (a Stream closed, a long poll given up).
_NOT_ERRORS = frozenset({"OK", "CANCELLED"})


@dataclass(frozen=True)
class ClientTotals:
    """One client's counters since the sidecar started (the Session heartbeat's report)."""

    client_id: str
    records: int
    acks: int
    errors: int
    requests: int
    last_seen: float
    active_streams: int


@dataclass
class _Client:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    transports: dict[str, int] = field(default_factory=dict)  # "unix" / "tcp" → calls
    durations: dict[str, Buckets] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    acks: int = 0
    redeliveries: int = 0
    active_streams: int = 0
    shared_memory_bytes: int = 0  # segments of its open ARROW_SHM streams
    frame_streams: int = 0  # its open Streams on the frame socket
    last_seen: float = 0.0


class ClientMetrics(Collector):
    """Per-client state (asyncio thread), rendered at scrape (HTTP thread): reads copy
    the dicts first, which the GIL keeps consistent against the one writer thread."""

    def __init__(
        self,
        group: str,
        limiter: ClientIdLimiter,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.limiter = limiter
        self._wall = wall
        self._monotonic = monotonic
        self._clients: dict[str, _Client] = {}
        self.record_age = Buckets(AGE_BUCKETS)
        self._delivered_to: dict[tuple[str, int], int] = {}  # (topic, partition) → next

    def client(self, client_id: str) -> tuple[str, _Client]:
        label, evicted = self.limiter.resolve(client_id or UNKNOWN_CLIENT, self._monotonic())
        if evicted is not None:
            self._clients.pop(evicted, None)
        state = self._clients.get(label)
        if state is None:
            state = self._clients[label] = _Client()
        state.last_seen = self._wall()
        return label, state

    def request(
        self, client_id: str, method: str, code: str, seconds: float, transport: str = "tcp"
    ) -> None:
        _label, state = self.client(client_id)
        key = (method, code)
        state.requests[key] = state.requests.get(key, 0) + 1
        state.transports[transport] = state.transports.get(transport, 0) + 1
        buckets = state.durations.get(method)
        if buckets is None:
            buckets = state.durations[method] = Buckets(REQUEST_BUCKETS)
        buckets.observe(seconds)

    def delivered(self, client_id: str, slices: Sequence[Slice], *, acked: bool) -> None:
        """Fetch/Stream handed ``slices`` to the client: records, bytes, record age and
        redeliveries, a few operations per slice whatever its length."""
        if not slices:
            return
        now_ms = int(self._wall() * 1000)
        records = nbytes = redelivered = 0
        marks = self._delivered_to
        for s in slices:
            lo, hi = s.lo, s.hi
            chunk = s.chunk
            records += hi - lo
            nbytes += s.vhi - s.vlo + s.khi - s.klo
            if chunk.timestamps is not None:
                self.record_age.observe_timestamps(chunk.timestamps, lo, hi, now_ms)
            key = (s.topic, s.partition)
            mark = marks.get(key, -1)
            offsets = chunk.offsets
            if offsets[lo] < mark:
                redelivered += bisect_left(offsets, mark, lo, hi) - lo
            if offsets[hi - 1] >= mark:
                marks[key] = offsets[hi - 1] + 1
        _label, state = self.client(client_id)
        state.records += records
        state.bytes += nbytes
        state.redeliveries += redelivered
        if acked:
            state.acks += records

    def served_records(self, client_id: str, records: int, nbytes: int) -> None:
        """ReadRange: records handed out (re-reads by design: no age, no redelivery)."""
        _label, state = self.client(client_id)
        state.records += records
        state.bytes += nbytes

    def acked(self, client_id: str, records: int) -> None:
        _label, state = self.client(client_id)
        state.acks += records

    def stream_opened(self, client_id: str) -> str:
        label, state = self.client(client_id)
        state.active_streams += 1
        self.limiter.pin(label)
        return label

    def shared_memory(self, label: str, nbytes: int) -> None:
        """A Stream of the client labelled ``label`` (:meth:`stream_opened`) made
        (``nbytes`` > 0) or gave up (< 0) a shared-memory segment."""
        state = self._clients.get(label)
        if state is not None:
            state.shared_memory_bytes += nbytes

    def frame_stream(self, label: str, opened: int) -> None:
        """A Stream of the client labelled ``label`` went on (1) or off (-1) the frame
        socket."""
        state = self._clients.get(label)
        if state is not None:
            state.frame_streams += opened

    def stream_closed(self, label: str) -> None:
        state = self._clients.get(label)
        if state is not None:
            state.active_streams -= 1
            state.last_seen = self._wall()
        self.limiter.unpin(label)

    def activity(self) -> list[ClientTotals]:
        """Every tracked client's totals, for the Session heartbeat (ListClients)."""
        return [
            ClientTotals(
                client_id=client_id,
                records=state.records,
                acks=state.acks,
                errors=sum(
                    n for (_m, code), n in list(state.requests.items()) if code not in _NOT_ERRORS
                ),
                requests=sum(list(state.requests.values())),
                last_seen=state.last_seen,
                active_streams=state.active_streams,
            )
            for client_id, state in list(self._clients.items())
        ]

    def describe(self) -> Iterable[Metric]:
        return []  # rendered at scrape only (labels are not known in advance)

    def collect(self) -> Iterable[Metric]:
        group = self.group
        clients = list(self._clients.items())
        requests = CounterMetricFamily(
            base_name("ds_client_requests_total"),
            help_of("ds_client_requests_total"),
            labels=["group", "client_id", "method", "code"],
        )
        transports = CounterMetricFamily(
            base_name("ds_client_transport_requests_total"),
            help_of("ds_client_transport_requests_total"),
            labels=["group", "client_id", "transport"],
        )
        durations = HistogramMetricFamily(
            "ds_client_request_duration_seconds",
            help_of("ds_client_request_duration_seconds"),
            labels=["group", "client_id", "method"],
        )
        simple = {
            name: (CounterMetricFamily if SPECS[name].type == "counter" else GaugeMetricFamily)(
                base_name(name), help_of(name), labels=["group", "client_id"]
            )
            for name in (
                "ds_client_records_served_total",
                "ds_client_bytes_served_total",
                "ds_client_active_streams",
                "ds_client_shared_memory_bytes",
                "ds_client_frame_streams",
                "ds_client_acks_total",
                "ds_client_redeliveries_total",
                "ds_client_last_seen_timestamp_seconds",
            )
        }
        for client_id, state in clients:
            for (method, code), count in list(state.requests.items()):
                requests.add_metric([group, client_id, method, code], count)
            for transport, count in list(state.transports.items()):
                transports.add_metric([group, client_id, transport], count)
            for method, buckets in list(state.durations.items()):
                durations.add_metric(
                    [group, client_id, method], buckets.cumulative(), buckets.total
                )
            labels = [group, client_id]
            simple["ds_client_records_served_total"].add_metric(labels, state.records)
            simple["ds_client_bytes_served_total"].add_metric(labels, state.bytes)
            simple["ds_client_active_streams"].add_metric(labels, state.active_streams)
            simple["ds_client_shared_memory_bytes"].add_metric(labels, state.shared_memory_bytes)
            simple["ds_client_frame_streams"].add_metric(labels, state.frame_streams)
            simple["ds_client_acks_total"].add_metric(labels, state.acks)
            simple["ds_client_redeliveries_total"].add_metric(labels, state.redeliveries)
            simple["ds_client_last_seen_timestamp_seconds"].add_metric(labels, state.last_seen)
        age = HistogramMetricFamily(
            "ds_sidecar_record_age_seconds",
            help_of("ds_sidecar_record_age_seconds"),
            labels=["group"],
        )
        age.add_metric([group], self.record_age.cumulative(), self.record_age.total)
        yield requests
        yield transports
        yield durations
        yield from simple.values()
        yield age


class AccessInterceptor(WrappingInterceptor):
    """Counts and times every StreamService call by client, method and status code.

    Installed inside :class:`services.runtime.error_interceptor.ErrorInterceptor`, so it sees a
    handler's :class:`DsError` before it becomes a status. The client id is the request's
    ``client_id``; a Stream's comes with its first (``open``) message."""

    def __init__(self, clients: ClientMetrics) -> None:
        self.clients = clients

    def covers(self, method: str) -> bool:
        return method.startswith(SERVICE_PREFIX)

    def wrap(
        self, method: str, behavior: Behavior, request_streaming: bool, response_streaming: bool
    ) -> Behavior:
        name = method.removeprefix(SERVICE_PREFIX)
        if response_streaming:  # a Stream's client id comes with its first (open) request
            return self._stream(name, behavior, peek=request_streaming)
        return self._unary(name, behavior)

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        clients = self.clients

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.monotonic()
            transport = transport_of(context)  # while the call is live
            code = "OK"
            try:
                return await behavior(request, context)
            except BaseException as exc:
                code = _code(exc, context)
                raise
            finally:
                client_id = str(getattr(request, "client_id", "") or "")
                clients.request(client_id, method, code, time.monotonic() - started, transport)

        return wrapped

    def _stream(
        self, method: str, behavior: Callable[..., Any], *, peek: bool
    ) -> Callable[..., Any]:
        clients = self.clients

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.monotonic()
            transport = transport_of(context)  # while the call is live
            call = _Call(str(getattr(request, "client_id", "") or "") if not peek else "")
            code = "OK"
            try:
                source = _FirstOpen(request, call) if peek else request
                async for response in behavior(source, context):
                    yield response
            except BaseException as exc:
                code = _code(exc, context)
                raise
            finally:
                clients.request(call.client_id, method, code, time.monotonic() - started, transport)

        return wrapped


@dataclass
class _Call:
    client_id: str


class _FirstOpen:
    """A Stream's request iterator, passed through, noting the client id of ``open``.

    Only the messages read with ``anext`` before an ``async for`` pass through it (the
    Stream reads its ``open`` so): once the client id is known, ``async for`` iterates
    the call's own iterator, so an ack or a credit costs no generator of ours on the way
    (issue 34, the per-message cost)."""

    def __init__(self, requests: AsyncIterable[Any], call: _Call) -> None:
        self._requests = aiter(requests)
        self._call = call

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._requests if self._call.client_id else self

    async def __anext__(self) -> Any:
        request = await anext(self._requests)
        if not self._call.client_id and request.WhichOneof("kind") == "open":
            self._call.client_id = request.open.client_id
        return request


def transport_of(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """How the caller reached the sidecar: ``unix`` over the pod's Unix domain socket
    (gRPC's peer ``unix:...``), else ``tcp``. Read when the call starts, never once it
    ended: a sidecar of bench_sidecar.py that read it at the end of each call segfaulted
    in cygrpc after a Stream its client had cancelled (not reproduced alone; the peer of
    a live call is what gRPC documents)."""
    return "unix" if context.peer().startswith("unix:") else "tcp"


def _code(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    if isinstance(exc, DsError):
        return exc.code.name
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK:
        return code.name
    return "UNKNOWN"
