"""Every metric of the sidecar, declared against the app's registry (ARCHITECTURE §5.3).

Three kinds of sources, one place:

* **Scrape-time views** (:class:`SidecarCollector`): lag, lead, buffers, assigned partitions,
  last poll age, assigner connection, computed from the partition table and the latest
  librdkafka statistics when Prometheus scrapes, so a revoked partition's series vanish
  with it and the hot path pays nothing.
* **librdkafka statistics** (``stats_cb``, :mod:`services.consumer_sidecar.stats`): Fetch
  requests, responses and bytes per broker, broker round trip and throttle time.
* **The sidecar's own timing and counts**: records and bytes consumed (per consume()
  batch, per partition run — never per record), polls, commits, lease changes, session
  heartbeats, record age at delivery, and the client-access metrics per ``client_id``.

Client-access metrics are kept per client in plain Python state rendered at scrape time
(:class:`ClientMetrics`): cheap to update on the delivery path, and an evicted client's
series go away whole. ``client_id`` cardinality is bounded by :class:`ClientIdLimiter`:
past the limit a new id is reported as ``other``, unless the least recently seen client has
been idle long enough to give up its place.

:data:`METRIC_TABLE` lists every exported name; the README's "Sidecar metrics" table and the
end-to-end test are both checked against it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from services.consumer_sidecar.stats import Statistics, WindowSums, WindowTotals
from services.runtime.errors import DsError

if TYPE_CHECKING:
    from services.consumer_sidecar.batches import Slice
    from services.consumer_sidecar.partitions import PartitionTable

OTHER_CLIENT = "other"
UNKNOWN_CLIENT = "unknown"  # a request without a client_id (Status; an invalid request)
SERVICE_PREFIX = "/dataservice.sidecar.v1.StreamService/"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_BUCKETS = (*LATENCY_BUCKETS, 30.0, 60.0, 300.0)
AGE_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
LEASE_KINDS = ("grant", "revoke", "expire")


# ---- the table of every exported metric -----------------------------------------------------


class MetricSpec(NamedTuple):
    name: str  # as exposed (counters with _total)
    type: str  # counter | gauge | histogram | summary
    labels: tuple[str, ...]
    source: str  # where the figure comes from
    help: str


def _spec(name: str, kind: str, labels: str, source: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, tuple(labels.split(",")) if labels else (), source, help_text)


G, GTP, GC = "group", "group,topic,partition", "group,client_id"
STATS = "librdkafka statistics"
OWN = "sidecar timing/counting"
VIEW = "partition table at scrape time"
METRIC_TABLE: tuple[MetricSpec, ...] = (
    _spec("ds_sidecar_records_consumed_total", "counter", "group,topic", OWN,
          "Records returned by the sidecar's consume() calls (counted per partition run)"),
    _spec("ds_sidecar_bytes_consumed_total", "counter", "group,topic", OWN,
          "Key plus value bytes of the records returned by consume()"),
    _spec("ds_sidecar_records_lag", "gauge", GTP, f"{STATS} hi_offset; {VIEW}",
          "Records between the fetch position and the high watermark (hi_offset at the last "
          "statistics; records buffered in the sidecar are not lag)"),
    _spec("ds_sidecar_records_lag_max", "gauge", G, f"{STATS}; {VIEW}",
          "Largest ds_sidecar_records_lag over the partitions this sidecar holds"),
    _spec("ds_sidecar_records_lead", "gauge", GTP, f"{STATS} lo_offset; {VIEW}",
          "Records between the log start offset (lo_offset) and the fetch position"),
    _spec("ds_sidecar_records_lead_min", "gauge", G, f"{STATS}; {VIEW}",
          "Smallest ds_sidecar_records_lead over the partitions this sidecar holds"),
    _spec("ds_sidecar_buffered_records", "gauge", GTP, VIEW,
          "Records fetched and buffered in the sidecar, not yet delivered"),
    _spec("ds_sidecar_buffer_bytes", "gauge", G, VIEW,
          "Bytes buffered (key, value and per-record bookkeeping)"),
    _spec("ds_sidecar_buffer_limit_bytes", "gauge", G, "settings buffer_max_bytes",
          "Buffer cap; fetching holds back when it is reached"),
    _spec("ds_sidecar_assigned_partitions", "gauge", G, VIEW,
          "Partitions whose lease this sidecar holds (kafka_group mode: assigned by Kafka)"),
    _spec("ds_sidecar_commits_total", "counter", "group,result", OWN,
          "Offset commit requests to Kafka, by result (ok, error)"),
    _spec("ds_sidecar_commit_latency_seconds", "histogram", G, OWN,
          "Duration of one synchronous offset commit request to Kafka"),
    _spec("ds_sidecar_lease_changes_total", "counter", "group,kind", "session commands",
          "Lease changes (grant, revoke incl. fenced, expire = local deadline passed)"),
    _spec("ds_sidecar_lease_change_latency_seconds", "histogram", "group,kind", OWN,
          "grant: grant received until Kafka fetching is set up; revoke: revoke received "
          "until the partition is drained, committed and released"),
    _spec("ds_sidecar_last_lease_change_timestamp_seconds", "gauge", G, OWN,
          "Unix time of the last lease change (0 = none yet)"),
    _spec("ds_sidecar_poll_interval_seconds", "histogram", G, OWN,
          "Time between the starts of successive consume() calls of the fetch loop"),
    _spec("ds_sidecar_poll_wait_seconds_total", "counter", G, OWN,
          "Time the fetch loop spent inside consume() waiting for records; its rate is the "
          "poll idle ratio"),
    _spec("ds_sidecar_last_poll_age_seconds", "gauge", G, OWN,
          "Seconds since the fetch loop's last consume() returned"),
    _spec("ds_sidecar_record_age_seconds", "histogram", G, OWN,
          "Age of each record when handed to a client (delivery time - record timestamp), "
          "observed per delivered slice: buckets exact when a partition's timestamps do not "
          "decrease, _sum estimated within each bucket; records without a timestamp are not "
          "observed"),
    _spec("ds_sidecar_heartbeats_total", "counter", G, OWN,
          "Session heartbeats sent to the assigner"),
    _spec("ds_sidecar_heartbeat_response_seconds", "histogram", G, OWN,
          "Session heartbeat round trip: sent until the assigner's ack arrived"),
    _spec("ds_sidecar_assigner_connected", "gauge", G, OWN,
          "1 while the session with the assigner is joined, else 0"),
    _spec("ds_sidecar_fetch_requests_total", "counter", "group,broker", f"{STATS} req.Fetch",
          "Fetch requests sent to each broker"),
    _spec("ds_sidecar_broker_responses_total", "counter", "group,broker", f"{STATS} rx",
          "Responses received from each broker (all request types)"),
    _spec("ds_sidecar_broker_received_bytes_total", "counter", "group,broker",
          f"{STATS} rxbytes", "Bytes received from each broker (all responses)"),
    _spec("ds_sidecar_broker_rtt_seconds", "summary", "group,broker", f"{STATS} rtt",
          "Broker request round trip (mostly Fetch, which waits up to fetch.wait.max.ms); "
          "quantiles over the last statistics window, _count/_sum cumulative"),
    _spec("ds_sidecar_broker_rtt_max_seconds", "gauge", "group,broker", f"{STATS} rtt.max",
          "Longest broker round trip in the last statistics window"),
    _spec("ds_sidecar_broker_throttle_seconds", "summary", "group,broker",
          f"{STATS} throttle", "Broker throttle time; quantiles over the last statistics "
          "window, _count/_sum cumulative"),
    _spec("ds_sidecar_broker_throttle_max_seconds", "gauge", "group,broker",
          f"{STATS} throttle.max", "Longest broker throttle time in the last statistics window"),
    _spec("ds_sidecar_kafka_errors_total", "counter", "kind,code", "librdkafka error_cb",
          "librdkafka errors by class (fatal, retriable, informational) and code"),
    _spec("ds_client_requests_total", "counter", "group,client_id,method,code", OWN,
          "StreamService calls by client, method and gRPC status code"),
    _spec("ds_client_request_duration_seconds", "histogram", "group,client_id,method", OWN,
          "StreamService call duration by client and method (a Stream: its lifetime)"),
    _spec("ds_client_records_served_total", "counter", GC, OWN,
          "Records handed to the client (Fetch, Stream and ReadRange)"),
    _spec("ds_client_bytes_served_total", "counter", GC, OWN,
          "Key plus value bytes handed to the client"),
    _spec("ds_client_active_streams", "gauge", GC, OWN, "Open Stream calls of the client"),
    _spec("ds_client_acks_total", "counter", GC, OWN,
          "Records acknowledged by the client (a range ack counts its offset span; "
          "auto_ack deliveries count as acked)"),
    _spec("ds_client_redeliveries_total", "counter", GC, OWN,
          "Records delivered again below the highest offset this sidecar process had "
          "already delivered of their partition (after a lease came back)"),
    _spec("ds_client_last_seen_timestamp_seconds", "gauge", GC, OWN,
          "Unix time of the client's last call or delivery"),
)  # fmt: skip
SPECS = {spec.name: spec for spec in METRIC_TABLE}


def _help(name: str) -> str:
    return SPECS[name].help


def _base(name: str) -> str:
    """prometheus_client appends ``_total`` to a counter's name itself."""
    return name.removesuffix("_total")


# ---- pure parts ---------------------------------------------------------------------------


class Buckets:
    """A histogram's state (non-cumulative bucket counts, the last one +Inf), cheap to
    update from one thread and rendered by a collector."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_timestamps(self, stamps: array[int], lo: int, hi: int, now_ms: int) -> None:
        """Ages (``now_ms`` - timestamp, seconds) of ``stamps[lo:hi]`` without a pass over
        the records: a few bisections, exact when the timestamps do not decrease (then the
        records of one bucket are a contiguous run). The sum is estimated per bucket from
        the ages at both ends of its run."""
        if hi <= lo:
            return
        first, last = stamps[lo], stamps[hi - 1]
        newest, oldest = sorted(((now_ms - last) / 1000, (now_ms - first) / 1000))
        k_lo = bisect_left(self.bounds, newest)
        k_hi = bisect_left(self.bounds, oldest)
        if k_lo == k_hi:
            self.counts[k_lo] += hi - lo
            self.total += (hi - lo) * (newest + oldest) / 2
            return
        upper = hi  # records [upper, hi) are counted (youngest first)
        for k in range(k_lo, k_hi):
            pos = bisect_left(stamps, now_ms - self.bounds[k] * 1000, lo, hi)
            pos = min(max(pos, lo), upper)
            self._add_run(k, stamps, pos, upper, now_ms)
            upper = pos
        self._add_run(k_hi, stamps, lo, upper, now_ms)

    def _add_run(self, k: int, stamps: array[int], lo: int, hi: int, now_ms: int) -> None:
        if hi > lo:
            self.counts[k] += hi - lo
            self.total += (hi - lo) * ((now_ms - stamps[lo]) + (now_ms - stamps[hi - 1])) / 2000

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else _float(bound), float(running)))
        return out


def _float(value: float) -> str:
    return repr(float(value))


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


@dataclass
class _Client:
    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    durations: dict[str, Buckets] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    acks: int = 0
    redeliveries: int = 0
    active_streams: int = 0
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

    def request(self, client_id: str, method: str, code: str, seconds: float) -> None:
        _label, state = self.client(client_id)
        key = (method, code)
        state.requests[key] = state.requests.get(key, 0) + 1
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

    def stream_closed(self, label: str) -> None:
        state = self._clients.get(label)
        if state is not None:
            state.active_streams -= 1
            state.last_seen = self._wall()
        self.limiter.unpin(label)

    def describe(self) -> Iterable[Metric]:
        return []  # rendered at scrape only (labels are not known in advance)

    def collect(self) -> Iterable[Metric]:
        group = self.group
        clients = list(self._clients.items())
        requests = CounterMetricFamily(
            _base("ds_client_requests_total"),
            _help("ds_client_requests_total"),
            labels=["group", "client_id", "method", "code"],
        )
        durations = HistogramMetricFamily(
            "ds_client_request_duration_seconds",
            _help("ds_client_request_duration_seconds"),
            labels=["group", "client_id", "method"],
        )
        simple = {
            name: (CounterMetricFamily if SPECS[name].type == "counter" else GaugeMetricFamily)(
                _base(name), _help(name), labels=["group", "client_id"]
            )
            for name in (
                "ds_client_records_served_total",
                "ds_client_bytes_served_total",
                "ds_client_active_streams",
                "ds_client_acks_total",
                "ds_client_redeliveries_total",
                "ds_client_last_seen_timestamp_seconds",
            )
        }
        for client_id, state in clients:
            for (method, code), count in list(state.requests.items()):
                requests.add_metric([group, client_id, method, code], count)
            for method, buckets in list(state.durations.items()):
                durations.add_metric(
                    [group, client_id, method], buckets.cumulative(), buckets.total
                )
            labels = [group, client_id]
            simple["ds_client_records_served_total"].add_metric(labels, state.records)
            simple["ds_client_bytes_served_total"].add_metric(labels, state.bytes)
            simple["ds_client_active_streams"].add_metric(labels, state.active_streams)
            simple["ds_client_acks_total"].add_metric(labels, state.acks)
            simple["ds_client_redeliveries_total"].add_metric(labels, state.redeliveries)
            simple["ds_client_last_seen_timestamp_seconds"].add_metric(labels, state.last_seen)
        age = HistogramMetricFamily(
            "ds_sidecar_record_age_seconds",
            _help("ds_sidecar_record_age_seconds"),
            labels=["group"],
        )
        age.add_metric([group], self.record_age.cumulative(), self.record_age.total)
        yield requests
        yield durations
        yield from simple.values()
        yield age


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Counts and times every StreamService call by client, method and status code.

    Installed inside :class:`services.runtime.errors.ErrorInterceptor`, so it sees a
    handler's :class:`DsError` before it becomes a status. The client id is the request's
    ``client_id``; a Stream's comes with its first (``open``) message."""

    def __init__(self, clients: ClientMetrics) -> None:
        self.clients = clients

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        path = str(handler_call_details.method)
        if handler is None or not path.startswith(SERVICE_PREFIX):
            return handler
        method = path.removeprefix(SERVICE_PREFIX)
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **kwargs
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream, peek=False), **kwargs
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(method, handler.stream_stream, peek=True), **kwargs
            )
        return handler

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        clients = self.clients

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.monotonic()
            code = "OK"
            try:
                return await behavior(request, context)
            except BaseException as exc:
                code = _code(exc, context)
                raise
            finally:
                client_id = str(getattr(request, "client_id", "") or "")
                clients.request(client_id, method, code, time.monotonic() - started)

        return wrapped

    def _stream(
        self, method: str, behavior: Callable[..., Any], *, peek: bool
    ) -> Callable[..., Any]:
        clients = self.clients

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.monotonic()
            call = _Call(str(getattr(request, "client_id", "") or "") if not peek else "")
            code = "OK"
            try:
                source = _first_open(request, call) if peek else request
                async for response in behavior(source, context):
                    yield response
            except BaseException as exc:
                code = _code(exc, context)
                raise
            finally:
                clients.request(call.client_id, method, code, time.monotonic() - started)

        return wrapped


@dataclass
class _Call:
    client_id: str


async def _first_open(requests: AsyncIterator[Any], call: _Call) -> AsyncIterator[Any]:
    """A Stream's request iterator, passed through, noting the client id of ``open``."""
    async for request in requests:
        if not call.client_id and request.WhichOneof("kind") == "open":
            call.client_id = request.open.client_id
        yield request


def _code(exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> str:
    if isinstance(exc, DsError):
        return exc.code.name
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED"
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK:
        return code.name
    return "UNKNOWN"


# ---- sidecar consumer metrics -------------------------------------------------------------


class PollTimer:
    """The fetch loop's polls: time between them, time waiting inside consume()."""

    def __init__(self, interval: Histogram, wait: Counter) -> None:
        self._interval = interval
        self._wait = wait
        self._previous: float | None = None

    def polled(self, started: float, returned: float) -> None:
        if self._previous is not None:
            self._interval.observe(started - self._previous)
        self._previous = started
        self._wait.inc(returned - started)


@dataclass
class _StatsView:
    latest: Statistics = field(default_factory=lambda: Statistics({}, {}))
    totals: WindowTotals = field(default_factory=WindowTotals)


class SidecarCollector(Collector):
    """Scrape-time gauges from the partition table and the latest statistics."""

    def __init__(
        self,
        group: str,
        table: PartitionTable,
        last_poll: Callable[[], float],
        connected: Callable[[], bool],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.table = table
        self._last_poll = last_poll
        self._connected = connected
        self._monotonic = monotonic
        self._stats = _StatsView()
        self._lock = threading.Lock()

    def apply_statistics(self, stats: Statistics) -> None:
        """Fetch thread (stats_cb)."""
        with self._lock:
            self._stats.latest = stats
            self._stats.totals.add(stats.brokers)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._partition_metrics()
        yield from self._broker_metrics()
        group = [self.group]
        yield _gauge("ds_sidecar_buffer_bytes", group, self.table.buffered_bytes)
        yield _gauge("ds_sidecar_buffer_limit_bytes", group, self.table.buffer_max_bytes)
        age = max(0.0, self._monotonic() - self._last_poll())
        yield _gauge("ds_sidecar_last_poll_age_seconds", group, age)
        yield _gauge("ds_sidecar_assigner_connected", group, 1.0 if self._connected() else 0.0)

    def _partition_metrics(self) -> Iterator[Metric]:
        with self._lock:
            stats = self._stats.latest.partitions
        names = ("ds_sidecar_records_lag", "ds_sidecar_records_lead", "ds_sidecar_buffered_records")
        families = {
            name: GaugeMetricFamily(name, _help(name), labels=["group", "topic", "partition"])
            for name in names
        }
        lags: list[int] = []
        leads: list[int] = []
        held = 0
        for part in sorted(self.table.snapshot(), key=lambda p: p.tp):
            if part.revoking:
                continue
            held += 1
            labels = [self.group, part.tp.topic, str(part.tp.partition)]
            families["ds_sidecar_buffered_records"].add_metric(labels, part.buffered_records)
            if part.position < 0:
                continue  # fetching not set up yet
            if part.high_watermark >= 0:
                lag = max(0, part.high_watermark - part.position)
                lags.append(lag)
                families["ds_sidecar_records_lag"].add_metric(labels, lag)
            pstats = stats.get(part.tp)
            if pstats is not None and pstats.log_start >= 0:
                lead = max(0, part.position - pstats.log_start)
                leads.append(lead)
                families["ds_sidecar_records_lead"].add_metric(labels, lead)
        yield from families.values()
        group = [self.group]
        yield _gauge("ds_sidecar_assigned_partitions", group, held)
        if lags:
            yield _gauge("ds_sidecar_records_lag_max", group, max(lags))
        if leads:
            yield _gauge("ds_sidecar_records_lead_min", group, min(leads))

    def _broker_metrics(self) -> Iterator[Metric]:
        with self._lock:
            brokers = dict(self._stats.latest.brokers)
            rtt = dict(self._stats.totals.rtt)
            throttle = dict(self._stats.totals.throttle)
        labels = ["group", "broker"]
        counters = {
            name: CounterMetricFamily(_base(name), _help(name), labels=labels)
            for name in (
                "ds_sidecar_fetch_requests_total",
                "ds_sidecar_broker_responses_total",
                "ds_sidecar_broker_received_bytes_total",
            )
        }
        maxima = {
            name: GaugeMetricFamily(name, _help(name), labels=labels)
            for name in (
                "ds_sidecar_broker_rtt_max_seconds",
                "ds_sidecar_broker_throttle_max_seconds",
            )
        }
        rtt_summary = Metric(
            "ds_sidecar_broker_rtt_seconds", _help("ds_sidecar_broker_rtt_seconds"), "summary"
        )
        throttle_summary = Metric(
            "ds_sidecar_broker_throttle_seconds",
            _help("ds_sidecar_broker_throttle_seconds"),
            "summary",
        )
        for name, broker in sorted(brokers.items()):
            if broker.node_id < 0:
                continue  # a bootstrap entry: the same broker under its learned name
            values = [self.group, name]
            counters["ds_sidecar_fetch_requests_total"].add_metric(values, broker.fetch_requests)
            counters["ds_sidecar_broker_responses_total"].add_metric(values, broker.responses)
            counters["ds_sidecar_broker_received_bytes_total"].add_metric(
                values, broker.received_bytes
            )
            maxima["ds_sidecar_broker_rtt_max_seconds"].add_metric(values, broker.rtt_us.max / 1e6)
            maxima["ds_sidecar_broker_throttle_max_seconds"].add_metric(
                values, broker.throttle_ms.max / 1e3
            )
            _summary(rtt_summary, self.group, name, rtt.get(name), 1e6)
            _summary(throttle_summary, self.group, name, throttle.get(name), 1e3)
        yield from counters.values()
        yield from maxima.values()
        yield rtt_summary
        yield throttle_summary


def _gauge(name: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, _help(name), labels=list(SPECS[name].labels))
    family.add_metric(labels, value)
    return family


def _summary(
    family: Metric, group: str, broker: str, sums: WindowSums | None, per_second: float
) -> None:
    if sums is None:
        return
    labels = {"group": group, "broker": broker}
    for quantile, value in (("0.5", sums.last.p50), ("0.99", sums.last.p99)):
        family.add_sample(family.name, {**labels, "quantile": quantile}, value / per_second)
    family.add_sample(family.name + "_count", labels, float(sums.count))
    family.add_sample(family.name + "_sum", labels, sums.total / per_second)


class SidecarMetrics:
    """All of the sidecar's metrics; hooks for the fetch loop, lease keeper and session.

    With ``enabled`` False (``DS_METRICS_ENABLED=false``) the per-batch and per-call hooks
    are not installed (the benchmark's baseline); scrape-time views stay."""

    def __init__(
        self,
        registry: CollectorRegistry,
        group: str,
        *,
        enabled: bool = True,
        max_client_ids: int = 100,
        client_idle_seconds: float = 600.0,
    ) -> None:
        self.group = group
        self.enabled = enabled
        self.kafka_errors = Counter(
            _base("ds_sidecar_kafka_errors_total"),
            _help("ds_sidecar_kafka_errors_total"),
            ["kind", "code"],
            registry=registry,
        )
        self._consumed_records = Counter(
            _base("ds_sidecar_records_consumed_total"),
            _help("ds_sidecar_records_consumed_total"),
            ["group", "topic"],
            registry=registry,
        )
        self._consumed_bytes = Counter(
            _base("ds_sidecar_bytes_consumed_total"),
            _help("ds_sidecar_bytes_consumed_total"),
            ["group", "topic"],
            registry=registry,
        )
        self._per_topic: dict[str, tuple[Any, Any]] = {}
        commits = Counter(
            _base("ds_sidecar_commits_total"),
            _help("ds_sidecar_commits_total"),
            ["group", "result"],
            registry=registry,
        )
        self._commit_ok = commits.labels(group, "ok")
        self._commit_error = commits.labels(group, "error")
        self._commit_latency = Histogram(
            "ds_sidecar_commit_latency_seconds",
            _help("ds_sidecar_commit_latency_seconds"),
            ["group"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(group)
        changes = Counter(
            _base("ds_sidecar_lease_changes_total"),
            _help("ds_sidecar_lease_changes_total"),
            ["group", "kind"],
            registry=registry,
        )
        self._lease_changes = {kind: changes.labels(group, kind) for kind in LEASE_KINDS}
        latency = Histogram(
            "ds_sidecar_lease_change_latency_seconds",
            _help("ds_sidecar_lease_change_latency_seconds"),
            ["group", "kind"],
            buckets=REQUEST_BUCKETS,
            registry=registry,
        )
        self._lease_latency = {kind: latency.labels(group, kind) for kind in ("grant", "revoke")}
        self._last_lease_change = Gauge(
            "ds_sidecar_last_lease_change_timestamp_seconds",
            _help("ds_sidecar_last_lease_change_timestamp_seconds"),
            ["group"],
            registry=registry,
        ).labels(group)
        self.polls = PollTimer(
            Histogram(
                "ds_sidecar_poll_interval_seconds",
                _help("ds_sidecar_poll_interval_seconds"),
                ["group"],
                buckets=POLL_BUCKETS,
                registry=registry,
            ).labels(group),
            Counter(
                _base("ds_sidecar_poll_wait_seconds_total"),
                _help("ds_sidecar_poll_wait_seconds_total"),
                ["group"],
                registry=registry,
            ).labels(group),
        )
        self._heartbeats = Counter(
            _base("ds_sidecar_heartbeats_total"),
            _help("ds_sidecar_heartbeats_total"),
            ["group"],
            registry=registry,
        ).labels(group)
        self._heartbeat_rtt = Histogram(
            "ds_sidecar_heartbeat_response_seconds",
            _help("ds_sidecar_heartbeat_response_seconds"),
            ["group"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(group)
        self.clients = ClientMetrics(group, ClientIdLimiter(max_client_ids, client_idle_seconds))
        registry.register(self.clients)
        self._registry = registry
        self.view: SidecarCollector | None = None

    def watch(
        self, table: PartitionTable, last_poll: Callable[[], float], connected: Callable[[], bool]
    ) -> SidecarCollector:
        """Register the scrape-time view of the partition table and statistics."""
        self.view = SidecarCollector(self.group, table, last_poll, connected)
        self._registry.register(self.view)
        return self.view

    # ---- hooks (each on the thread named) -------------------------------------------------

    def consumed(self, topic: str, records: int, nbytes: int) -> None:
        """Fetch thread: one partition run of a consume() batch."""
        children = self._per_topic.get(topic)
        if children is None:
            children = self._per_topic[topic] = (
                self._consumed_records.labels(self.group, topic),
                self._consumed_bytes.labels(self.group, topic),
            )
        children[0].inc(records)
        children[1].inc(nbytes)

    def committed(self, ok: bool, seconds: float) -> None:
        """Fetch thread: one commit request to Kafka."""
        (self._commit_ok if ok else self._commit_error).inc()
        self._commit_latency.observe(seconds)

    def lease_changed(self, kind: str) -> None:
        """asyncio thread: a grant, revoke or local expiry."""
        self._lease_changes[kind].inc()
        self._last_lease_change.set(time.time())

    def lease_settled(self, kind: str, seconds: float) -> None:
        self._lease_latency[kind].observe(seconds)

    def heartbeat_sent(self) -> None:
        self._heartbeats.inc()

    def heartbeat_acked(self, seconds: float) -> None:
        self._heartbeat_rtt.observe(seconds)

    def statistics(self, stats: Statistics) -> None:
        if self.view is not None:
            self.view.apply_statistics(stats)


# ---- the operators' names (Java consumer MBeans) → ours -----------------------------------


class OperatorName(NamedTuple):
    java: str  # the Java consumer's metric (kafka.consumer:type=consumer-fetch-manager-metrics…)
    ours: str  # our metric, or "—" when it cannot exist here
    promql: str  # how to get the figure (or why it does not exist)


OPERATOR_NAMES: tuple[OperatorName, ...] = (
    OperatorName("records-lag-max", "ds_sidecar_records_lag_max",
                 "`max_over_time(ds_sidecar_records_lag_max[1m])`"),
    OperatorName("records-lag (per partition)", "ds_sidecar_records_lag",
                 "`ds_sidecar_records_lag`"),
    OperatorName("records-lag-avg (per partition)", "ds_sidecar_records_lag",
                 "`avg_over_time(ds_sidecar_records_lag[1m])`"),
    OperatorName("records-lag-max (per partition)", "ds_sidecar_records_lag",
                 "`max_over_time(ds_sidecar_records_lag[1m])`"),
    OperatorName("records-lead (per partition)", "ds_sidecar_records_lead",
                 "`ds_sidecar_records_lead`"),
    OperatorName("records-lead-min", "ds_sidecar_records_lead_min",
                 "`min_over_time(ds_sidecar_records_lead_min[1m])`"),
    OperatorName("records-consumed-rate", "ds_sidecar_records_consumed_total",
                 "`rate(ds_sidecar_records_consumed_total[1m])`"),
    OperatorName("records-consumed-total", "ds_sidecar_records_consumed_total",
                 "`ds_sidecar_records_consumed_total`"),
    OperatorName("bytes-consumed-rate", "ds_sidecar_bytes_consumed_total",
                 "`rate(ds_sidecar_bytes_consumed_total[1m])`"),
    OperatorName("bytes-consumed-total", "ds_sidecar_bytes_consumed_total",
                 "`ds_sidecar_bytes_consumed_total`"),
    OperatorName("records-per-request-avg", "ds_sidecar_records_consumed_total",
                 "`sum(rate(ds_sidecar_records_consumed_total[1m])) / "
                 "sum(rate(ds_sidecar_fetch_requests_total[1m]))`"),
    OperatorName("fetch-latency-avg", "ds_sidecar_broker_rtt_seconds",
                 "`rate(ds_sidecar_broker_rtt_seconds_sum[1m]) / "
                 "rate(ds_sidecar_broker_rtt_seconds_count[1m])` (librdkafka times every "
                 "request to the broker; a consumer's are nearly all Fetch)"),
    OperatorName("fetch-latency-max", "ds_sidecar_broker_rtt_max_seconds",
                 "`max_over_time(ds_sidecar_broker_rtt_max_seconds[1m])`"),
    OperatorName("fetch-rate", "ds_sidecar_fetch_requests_total",
                 "`rate(ds_sidecar_fetch_requests_total[1m])`"),
    OperatorName("fetch-size-avg", "ds_sidecar_bytes_consumed_total",
                 "`sum(rate(ds_sidecar_bytes_consumed_total[1m])) / "
                 "sum(rate(ds_sidecar_fetch_requests_total[1m]))`"),
    OperatorName("fetch-size-max", "—",
                 "cannot exist: librdkafka decodes Fetch responses internally and reports no "
                 "per-response size; `ds_sidecar_broker_received_bytes_total` / "
                 "`ds_sidecar_broker_responses_total` gives the mean response size"),
    OperatorName("fetch-throttle-time-avg / -max", "ds_sidecar_broker_throttle_seconds",
                 "avg: `rate(…_sum[1m]) / rate(…_count[1m])`; max: "
                 "`ds_sidecar_broker_throttle_max_seconds`"),
    OperatorName("commit-latency-avg", "ds_sidecar_commit_latency_seconds",
                 "`rate(ds_sidecar_commit_latency_seconds_sum[1m]) / "
                 "rate(ds_sidecar_commit_latency_seconds_count[1m])`"),
    OperatorName("commit-latency-max", "ds_sidecar_commit_latency_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_commit_latency_seconds_bucket[1m]))` "
                 "(bucket bound)"),
    OperatorName("commit-rate", "ds_sidecar_commits_total", "`rate(ds_sidecar_commits_total[1m])`"),
    OperatorName("commit-total", "ds_sidecar_commits_total", "`ds_sidecar_commits_total`"),
    OperatorName("assigned-partitions", "ds_sidecar_assigned_partitions",
                 "`ds_sidecar_assigned_partitions`"),
    OperatorName("rebalance-total (here: lease changes)", "ds_sidecar_lease_changes_total",
                 "`sum by (group) (ds_sidecar_lease_changes_total)`"),
    OperatorName("rebalance-rate-per-hour", "ds_sidecar_lease_changes_total",
                 "`sum by (group) (increase(ds_sidecar_lease_changes_total[1h]))`"),
    OperatorName("rebalance-latency-avg / -max", "ds_sidecar_lease_change_latency_seconds",
                 "avg: `rate(…_sum[5m]) / rate(…_count[5m])`; max: "
                 "`histogram_quantile(1, rate(…_bucket[5m]))`"),
    OperatorName("last-rebalance-seconds-ago", "ds_sidecar_last_lease_change_timestamp_seconds",
                 "`time() - ds_sidecar_last_lease_change_timestamp_seconds`"),
    OperatorName("time-between-poll-avg", "ds_sidecar_poll_interval_seconds",
                 "`rate(ds_sidecar_poll_interval_seconds_sum[1m]) / "
                 "rate(ds_sidecar_poll_interval_seconds_count[1m])`"),
    OperatorName("time-between-poll-max", "ds_sidecar_poll_interval_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_poll_interval_seconds_bucket[1m]))`"),
    OperatorName("last-poll-seconds-ago", "ds_sidecar_last_poll_age_seconds",
                 "`ds_sidecar_last_poll_age_seconds`"),
    OperatorName("poll-idle-ratio-avg", "ds_sidecar_poll_wait_seconds_total",
                 "`rate(ds_sidecar_poll_wait_seconds_total[1m])`"),
    OperatorName("heartbeat-rate (here: session heartbeats)", "ds_sidecar_heartbeats_total",
                 "`rate(ds_sidecar_heartbeats_total[1m])`"),
    OperatorName("heartbeat-response-time-max", "ds_sidecar_heartbeat_response_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_heartbeat_response_seconds_bucket[1m]))`"),
    OperatorName("last-heartbeat-seconds-ago", "ds_sidecar_assigner_connected",
                 "not exported as such: a sidecar without heartbeat acks loses its leases "
                 "within the TTL; `ds_sidecar_assigner_connected == 0` is the alert"),
    OperatorName("join-rate / sync-rate / sync-time", "—",
                 "cannot exist in leased mode: no Kafka group membership (assign() only); "
                 "joins are the session's, counted as lease grants"),
)  # fmt: skip
