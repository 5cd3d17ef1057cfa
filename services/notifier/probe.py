"""The end-to-end delivery probe (kminion's end-to-end monitoring, through the mesh).

Every ``interval_seconds`` the notifier produces one probe record to each partition of the
probe topic (``ds.probe``, created if missing), and a consumer thread reads the topic
*through the mesh*: a :class:`DsClient` of the leased probe group (``ds-probe``, created
through the assigner's AdminService if missing) binds via the assigner, fetches from the
sidecar serving the group and acks. So a probe received proves the whole path a real
application uses: producer → Kafka → sidecar (lease, fetch, buffer) → client → ack/commit.

Bookkeeping (sent → received / lost / late) is :mod:`probe_tracker`'s; this module does the
I/O, the metrics, and hands PROBE_LOST open/resolve changes to the notifier's fault path
(:meth:`Prober.tick`, called by the app every ``TICK_SECONDS``).

A sidecar serving the probe group must run (one per environment). Run the probe on one
notifier replica, or give each replica its own probe group: replicas sharing a group would
split the probe partitions between them and each see the other's probes as lost.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import grpc
import structlog
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient import Batch, DsClient
from dsclient.connection import (
    DEFAULT_SETTINGS,
    FOLLOW_ONCE,
    AssignerTarget,
    ConnectionSettings,
    LeaderFollower,
)
from dsclient.reasons import Reason, error_info
from services.notifier.metrics import ProbeMetrics
from services.notifier.probe_tracker import FaultChange, Outcome, ProbeMessage, ProbeTracker
from services.notifier.probe_tracker import decode as decode_probe
from services.notifier.settings import ProbeSettings
from services.runtime import faults
from services.runtime.topics import TopicSpec, ensure_topic

log = structlog.get_logger(__name__)

TICK_SECONDS = 0.5  # how often lost probes are looked for (and a round sent when due)
TOPIC_RETENTION_MS = 3_600_000  # probes are worthless after a while; an hour is plenty
METADATA_REFRESH_SECONDS = 60.0  # the probe topic's partition count is re-read this often
FETCH_WAIT_SECONDS = 1.0
FETCH_CALL_TIMEOUT_SECONDS = 10.0  # a stopped sidecar holds a Fetch this long at most


def new_instance_id(hostname: str) -> str:
    """This run's probe identity: a restarted notifier ignores its previous run's probes."""
    return f"{hostname}-{uuid.uuid4().hex[:8]}"


def fault_event(
    change: FaultChange, settings: ProbeSettings, instance: str
) -> common_pb2.FaultEvent:
    """The PROBE_LOST event (OPEN or RESOLVED) of a tracker change."""
    spec = faults.CATALOGUE[common_pb2.FAULT_TYPE_PROBE_LOST]
    partitions = ",".join(str(p) for p in change.partitions)
    if change.opened:
        message = (
            f"probe topic {settings.topic}: {change.lost} probe(s) not consumed through group "
            f"{settings.group} within {settings.timeout_seconds:g} s "
            f"(partitions {partitions})"
        )
    else:
        message = (
            f"probe topic {settings.topic}: probes flow again through group {settings.group} "
            f"({change.lost} lost meanwhile)"
        )
    event = common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_PROBE_LOST,
        state=common_pb2.FAULT_STATE_OPEN if change.opened else common_pb2.FAULT_STATE_RESOLVED,
        severity=spec.severity,
        source_service="notifier",
        source_instance=instance,
        group=settings.group,
        topic=settings.topic,
        partitions=list(change.partitions),
        message=message,
        # One key for the episode: the partition set may grow while it is open.
        dedupe_key=faults.dedupe_key(spec.type, settings.group, settings.topic),
    )
    event.attributes.update(
        {
            "lost": str(change.lost),
            "timeout_seconds": f"{settings.timeout_seconds:g}",
            "partitions": partitions,
        }
    )
    return event


class Prober:
    """Produces probe rounds, consumes them through the mesh, exports what happened."""

    def __init__(
        self,
        settings: ProbeSettings,
        *,
        instance: str,
        admin: AdminClient,
        producer: Producer,
        metrics: ProbeMetrics,
        consul: str | None = None,
        connection: ConnectionSettings = DEFAULT_SETTINGS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.instance = instance
        self._admin = admin
        self._producer = producer
        self.metrics = metrics
        self._consul = consul
        self._connection = connection
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()  # the tracker: tick thread and consumer thread
        self.tracker = ProbeTracker(instance, settings.timeout_seconds)
        self._partitions = 0
        self._partitions_read_at = float("-inf")
        self._next_round = float("-inf")
        self._group_ready = False
        self._bound = threading.Event()  # rounds start once the consumer is bound
        self._stop = threading.Event()
        self._client: DsClient | None = None
        self._consumer = threading.Thread(target=self._consume, name="probe-consumer", daemon=True)

    # ---- lifecycle --------------------------------------------------------------------

    def setup(self) -> None:
        """Create the probe topic if missing (blocking; idempotent)."""
        spec = TopicSpec(
            self.settings.topic,
            self.settings.partitions,
            self.settings.replication,
            {"retention.ms": str(TOPIC_RETENTION_MS)},
        )
        ensure_topic(self._admin, spec)

    def start(self) -> None:
        self._consumer.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            client = self._client
        if client is not None:
            client.close()  # wakes a fetch in progress
        if self._consumer.is_alive():
            self._consumer.join(FETCH_CALL_TIMEOUT_SECONDS + 5)
        self._producer.flush(5)

    # ---- producing (the app's tick, in a worker thread) ---------------------------------

    def tick(self) -> FaultChange | None:
        """Send a round if one is due, count lost probes; the PROBE_LOST change, if any."""
        now = self._clock()
        if self._bound.is_set() and now >= self._next_round:
            self._next_round = now + self.settings.interval_seconds
            self._send_round(now)
        self._producer.poll(0)  # delivery reports
        with self._lock:
            lost = self.tracker.expire(self._clock())
            change = self.tracker.fault_change()
            in_flight = self.tracker.in_flight
        for probe in lost:
            self.metrics.lost.labels(str(probe.partition)).inc()
        if lost:
            log.warning(
                "probes lost",
                count=len(lost),
                partitions=sorted({p.partition for p in lost}),
                timeout_seconds=self.settings.timeout_seconds,
            )
        self.metrics.in_flight.set(in_flight)
        return change

    def _partition_count(self, now: float) -> int:
        if now - self._partitions_read_at >= METADATA_REFRESH_SECONDS or not self._partitions:
            metadata = self._producer.list_topics(self.settings.topic, timeout=5)
            info = metadata.topics.get(self.settings.topic)
            if info is not None and info.error is None and info.partitions:
                self._partitions = len(info.partitions)
                self._partitions_read_at = now
        return self._partitions

    def _send_round(self, now: float) -> None:
        count = self._partition_count(now)
        wall_ms = int(self._wall_clock() * 1000)
        for partition in range(count):
            with self._lock:
                probe = self.tracker.next_probe(partition, self._clock(), wall_ms)
            try:
                self._producer.produce(
                    self.settings.topic,
                    key=probe.key(),
                    value=probe.value(),
                    partition=partition,
                    on_delivery=self._delivery_report(probe),
                )
            except Exception as exc:  # BufferError (queue full), KafkaException
                self._produce_failed(probe, repr(exc))
                continue
            self.metrics.sent.labels(str(partition)).inc()
            # Export 0 from the first probe on, so rate()/increase() see the first loss.
            self.metrics.lost.labels(str(partition))

    def _delivery_report(self, probe: ProbeMessage) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._produce_failed(probe, err.str())

        return report

    def _produce_failed(self, probe: ProbeMessage, why: str) -> None:
        self.metrics.produce_errors.inc()
        with self._lock:
            self.tracker.produce_failed(probe)
        log.warning("probe not produced", partition=probe.partition, error=why)

    # ---- consuming through the mesh (own thread) ------------------------------------------

    def _consume(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            client: DsClient | None = None
            try:
                self._ensure_group()
                client = DsClient(
                    self.settings.group,
                    client_id=f"ds-probe-{self.instance}",
                    assigner=self.settings.assigner,
                    consul=self._consul,
                    max_wait=FETCH_WAIT_SECONDS,
                    call_timeout=FETCH_CALL_TIMEOUT_SECONDS,
                    connection=self._connection,
                )
                with self._lock:
                    self._client = client
                if self._stop.is_set():
                    return
                self._bound.set()
                log.info(
                    "probe consumer bound", group=self.settings.group, sidecars=client.endpoints
                )
                backoff = 0.5
                while not self._stop.is_set():
                    batch = client.fetch(500)
                    if batch:
                        self._on_batch(batch)
                        client.ack(batch)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.metrics.consumer_errors.inc()
                log.warning("probe consumer failed; retrying", error=repr(exc), backoff=backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                with self._lock:
                    self._client = None
                if client is not None:
                    client.close()

    def _on_batch(self, batch: Batch) -> None:
        now = self._clock()
        for record in batch:
            try:
                probe = decode_probe(record.value)
            except ValueError:
                self.metrics.discarded.labels("undecodable").inc()
                continue
            with self._lock:
                receipt = self.tracker.received(probe, now)
            if receipt.outcome is Outcome.RECEIVED:
                assert receipt.roundtrip_seconds is not None
                self.metrics.received.inc()
                self.metrics.roundtrip.observe(receipt.roundtrip_seconds)
                self.metrics.last_success.set(self._wall_clock())
            elif receipt.outcome is Outcome.LATE:
                self.metrics.late.inc()
                log.info(
                    "late probe",
                    partition=probe.partition,
                    roundtrip_seconds=round(receipt.roundtrip_seconds or 0.0, 3),
                )
            else:
                self.metrics.discarded.labels(receipt.outcome.value).inc()

    def _ensure_group(self) -> None:
        """Create the leased probe group through the assigner's AdminService (once): on
        the leader the Consul key names (given Consul), or following a redirect once."""
        if self._group_ready:
            return
        target = AssignerTarget((self.settings.assigner,), self._consul)
        assigner = LeaderFollower(target, self._connection)
        try:
            assigner.locate()
            assigner.call(admin_pb2_grpc.AdminServiceStub, self._create_group, FOLLOW_ONCE)
        finally:
            assigner.close()
        self._group_ready = True

    def _create_group(self, stub: admin_pb2_grpc.AdminServiceStub) -> None:
        group = types_pb2.GroupConfig(
            name=self.settings.group,
            topics=[self.settings.topic],
            mode=common_pb2.GROUP_MODE_LEASED,
        )
        try:
            stub.CreateGroup(admin_pb2.CreateGroupRequest(group=group), timeout=10)
        except grpc.RpcError as err:
            info = error_info(err)
            if info is None or info.reason != Reason.GROUP_ALREADY_EXISTS.value:
                raise
            # Configured by an operator (other settings): use it as it is.
            log.info("probe group exists", group=self.settings.group, detail=err.details())
            return
        log.info("probe group ready", group=self.settings.group, topic=self.settings.topic)
