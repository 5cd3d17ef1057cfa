"""The fault reporter every service uses to tell the notifier (ARCHITECTURE §5.4).

``report()`` never blocks and never raises: it stamps the event (a new UUID, the detection
time, the source) and puts it in a bounded in-memory buffer. A background thread sends the
buffer, oldest first, with ``NotifierService.ReportFault``; while the notifier is
unreachable it retries the same event with jittered exponential backoff (the notifier
answers a re-sent id as before, so a retry after a lost answer is harmless). Only a full
buffer drops events (the oldest, counted in ``ds_fault_reports_dropped``); an event the
notifier refuses as invalid is counted in ``ds_fault_reports_rejected`` and logged.

``track()`` turns a condition into OPEN/RESOLVED pairs: it reports OPEN when a key becomes
active and RESOLVED when it stops being active, nothing in between.

Where the notifier is: ``--notifier HOST:PORT`` (``DS_NOTIFIER``); else, with ``--consul``,
a healthy ``ds-notifier`` instance looked up before each (re)connect; else nowhere, and
faults are only logged.

This module knows no fault of any service: what each service reports, and when, is that
service's emitters (``services/assigner/fault_emitters.py``,
``services/consumer_sidecar/fault_emitters.py``), which call ``report()`` / ``track()``
here and wrap their hooks in :func:`never_raises`.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.connection import DEFAULT_SETTINGS, ConnectionSettings, open_channel
from services.runtime.faults import (
    CATALOGUE,
    OPEN,
    RESOLVED,
    FaultTypeValue,
    short_state,
    short_type,
)

log = structlog.get_logger(__name__)

# Codes worth retrying: the notifier is down, overloaded, starting, or the answer was lost.
_RETRY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)


P = ParamSpec("P")
R = TypeVar("R")


def never_raises(fn: Callable[P, R | None]) -> Callable[P, R | None]:
    """Fault hooks run inside the data path (librdkafka callbacks, the assigner's tick):
    a bug in reporting must cost a log line, never the caller."""

    @functools.wraps(fn)
    def safe(*args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return fn(*args, **kwargs)
        except Exception:
            log.exception("fault hook failed", hook=fn.__qualname__)
            return None

    return safe


@dataclass(frozen=True)
class ReporterConfig:
    source_service: str  # "assigner", "sidecar", "notifier"
    source_instance: str
    notifier: str | None = None  # HOST:PORT
    consul: str | None = None  # HOST:PORT, to look up ds-notifier when notifier is None
    capacity: int = 10_000
    call_timeout: float = 5.0
    max_backoff: float = 30.0
    # How the notifier is reached (TLS, the service's token).
    connection: ConnectionSettings = DEFAULT_SETTINGS


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.sent = Counter(
            "ds_fault_reports_sent",
            "Fault reports accepted by the notifier",
            ["type"],
            registry=registry,
        )
        self.dropped = Counter(
            "ds_fault_reports_dropped",
            "Fault reports dropped because the local buffer was full",
            registry=registry,
        )
        self.rejected = Counter(
            "ds_fault_reports_rejected",
            "Fault reports the notifier refused as invalid",
            registry=registry,
        )
        self.buffered = Gauge(
            "ds_fault_reports_buffered",
            "Fault reports waiting to be sent to the notifier",
            registry=registry,
        )


class FaultReporter:
    def __init__(
        self,
        config: ReporterConfig,
        registry: CollectorRegistry | None = None,
        *,
        resolve: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config
        self._resolve = resolve or self._default_resolver()
        self._buffer: deque[common_pb2.FaultEvent] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._tracked: dict[object, common_pb2.FaultEvent] = {}
        self._metrics = _Metrics(registry)
        self.dropped = 0

    @classmethod
    def disabled(cls, source_service: str = "unknown") -> FaultReporter:
        """A reporter that only logs (no notifier configured)."""
        return cls(ReporterConfig(source_service, ""), resolve=lambda: None)

    @property
    def enabled(self) -> bool:
        return self.config.notifier is not None or self.config.consul is not None

    def _default_resolver(self) -> Callable[[], str | None]:
        if self.config.notifier:
            address = self.config.notifier
            return lambda: address
        if self.config.consul:
            return _ConsulLookup(self.config.consul)
        return lambda: None

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fault-reporter", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Give buffered reports up to ``timeout`` seconds to go out, then stop."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._buffer and self._thread is not None and time.monotonic() < deadline:
                self._cond.wait(0.05)
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()) + self.config.call_timeout)
        if self._buffer:
            log.warning("fault reports not delivered at shutdown", count=len(self._buffer))

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._buffer)

    def buffered(self) -> list[common_pb2.FaultEvent]:
        """A copy of what waits to be sent, oldest first."""
        with self._cond:
            return list(self._buffer)

    # ---- reporting (any thread, never blocks) ------------------------------------------

    @never_raises
    def report(
        self,
        fault_type: FaultTypeValue,
        state: common_pb2.FaultState.ValueType = OPEN,
        *,
        group: str = "",
        topic: str = "",
        partitions: Iterable[int] = (),
        consumer_id: str = "",
        client_id: str = "",
        message: str = "",
        attributes: Mapping[str, object] | None = None,
        severity: common_pb2.Severity.ValueType | None = None,
        dedupe_key: str = "",
    ) -> str:
        """Queue one fault event; returns its id."""
        spec = CATALOGUE.get(fault_type)
        event = common_pb2.FaultEvent(
            id=str(uuid.uuid4()),
            type=fault_type,
            state=state,
            severity=severity
            if severity is not None
            else (spec.severity if spec else common_pb2.SEVERITY_WARNING),
            source_service=self.config.source_service,
            source_instance=self.config.source_instance,
            group=group,
            topic=topic,
            partitions=sorted(partitions),
            consumer_id=consumer_id,
            client_id=client_id,
            message=message[:4000],
            dedupe_key=dedupe_key,
        )
        event.detected_at.FromNanoseconds(time.time_ns())
        for key, value in (attributes or {}).items():
            event.attributes[str(key)] = str(value)[:1000]
        log.debug(
            "fault",
            type=short_type(fault_type),
            state=short_state(state),
            group=group,
            consumer_id=consumer_id or None,
            fault_message=message or None,
        )
        if not self.enabled:
            return event.id
        with self._cond:
            if len(self._buffer) >= self.config.capacity:
                self._buffer.popleft()
                self.dropped += 1
                self._metrics.dropped.inc()
            self._buffer.append(event)
            self._metrics.buffered.set(len(self._buffer))
            self._cond.notify()
        return event.id

    @never_raises
    def track(
        self,
        key: object,
        active: bool,
        fault_type: FaultTypeValue,
        *,
        repeat: bool = False,
        **fields: object,
    ) -> str | None:
        """Report OPEN when ``key`` becomes active, RESOLVED (with the OPEN event's
        coordinates and dedupe key) when it stops; nothing while it stays as it is, unless
        ``repeat`` (every occurrence is reported, e.g. each failed commit)."""
        opened = self._tracked.get(key)
        if active and (opened is None or repeat):
            event_id = self.report(fault_type, OPEN, **fields)  # type: ignore[arg-type]
            self._tracked[key] = common_pb2.FaultEvent(
                group=str(fields.get("group", "")),
                topic=str(fields.get("topic", "")),
                partitions=list(fields.get("partitions", ()) or ()),  # type: ignore[call-overload]
                consumer_id=str(fields.get("consumer_id", "")),
                client_id=str(fields.get("client_id", "")),
                dedupe_key=str(fields.get("dedupe_key", "")),
            )
            return event_id
        if not active and opened is not None:
            del self._tracked[key]
            return self.report(
                fault_type,
                RESOLVED,
                group=opened.group,
                topic=opened.topic,
                partitions=list(opened.partitions),
                consumer_id=opened.consumer_id,
                client_id=opened.client_id,
                dedupe_key=opened.dedupe_key,
                message=str(fields.get("message", "")),
            )
        return None

    def is_open(self, key: object) -> bool:
        return key in self._tracked

    # ---- the sender thread ----------------------------------------------------------------

    def _run(self) -> None:
        channel: grpc.Channel | None = None
        stub: notifier_pb2_grpc.NotifierServiceStub | None = None
        address: str | None = None
        backoff = 0.1
        while True:
            with self._cond:
                while not self._buffer and not self._stop:
                    self._cond.wait()
                if self._stop:
                    break
                event = self._buffer[0]
            if stub is None:
                address = self._safe_resolve()
                if address is not None:
                    channel = open_channel(address, self.config.connection)
                    stub = notifier_pb2_grpc.NotifierServiceStub(channel)
            outcome = "unreachable" if stub is None else self._send(stub, event)
            if outcome == "retry" or outcome == "unreachable":
                if channel is not None and outcome == "retry" and self.config.consul:
                    channel.close()  # look the notifier up again: it may have moved
                    channel, stub = None, None
                with self._cond:
                    if self._stop:
                        break
                    self._cond.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self.config.max_backoff)
                continue
            backoff = 0.1
            with self._cond:
                if self._buffer and self._buffer[0] is event:
                    self._buffer.popleft()
                self._metrics.buffered.set(len(self._buffer))
                self._cond.notify_all()
        if channel is not None:
            channel.close()

    def _safe_resolve(self) -> str | None:
        try:
            return self._resolve()
        except Exception as exc:
            log.warning("notifier lookup failed", error=str(exc))
            return None

    def _send(
        self, stub: notifier_pb2_grpc.NotifierServiceStub, event: common_pb2.FaultEvent
    ) -> str:
        try:
            stub.ReportFault(
                notifier_pb2.ReportFaultRequest(event=event), timeout=self.config.call_timeout
            )
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            if code in _RETRY:
                return "retry"
            self._metrics.rejected.inc()
            log.error(
                "fault report rejected by the notifier",
                type=short_type(event.type),
                code=code.name if code else "?",
                error=err.details() if hasattr(err, "details") else str(err),
            )
            return "rejected"
        self._metrics.sent.labels(short_type(event.type)).inc()
        return "sent"


class _ConsulLookup:
    """A healthy ``ds-notifier`` from Consul, asked afresh on every (re)connect."""

    def __init__(self, address: str) -> None:
        import consul

        host, _, port = address.rpartition(":")
        self._client = consul.Consul(host=host, port=int(port), connections_timeout=5)

    def __call__(self) -> str | None:
        _index, nodes = self._client.health.service("ds-notifier", passing=True)
        if not nodes:
            return None
        service = random.choice(nodes)["Service"]
        return f"{service['Address']}:{service['Port']}"


def reporter_for(
    settings: object,
    source_service: str,
    source_instance: str,
    registry: CollectorRegistry | None,
) -> FaultReporter:
    """The reporter of a service, configured from its settings (``notifier``, ``consul``)."""
    notifier = getattr(settings, "notifier", None)
    consul_address = getattr(settings, "consul", None)
    connection: ConnectionSettings = getattr(settings, "connection", DEFAULT_SETTINGS)
    return FaultReporter(
        ReporterConfig(
            source_service=source_service,
            source_instance=source_instance,
            notifier=notifier,
            consul=consul_address,
            # The notifier's own token (DS_TLS__NOTIFIER_TOKEN_FILE, audience ds-notifier)
            # when set: a pod's ds-assigner token is refused there.
            connection=connection.with_tls(connection.tls.for_notifier()),
        ),
        registry,
    )
