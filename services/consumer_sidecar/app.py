"""Sidecar wiring and lifecycle: builds the partition table, the offset committer, the
Kafka fetch thread, the lease keeper, the assigner session and the StreamService servicer,
and runs and stops them.

Each part reports through an events interface (``events.py``) handed to its constructor;
they are built here, once. What each part does lives in its own module: the delivery view
the servicer is given (``serving.py``), the consumer configurations (``kafka_config.py``),
librdkafka's callbacks (``kafka_callbacks.py``), compatibility mode ``kafka_group``
(``kafka_group_mode.py``, ``kafka_group_membership.py``), the CLIENT_BACKPRESSURE watcher
(``backpressure_watch.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog
from confluent_kafka import Consumer, KafkaException
from prometheus_client import CollectorRegistry, ProcessCollector

from dataservice.assigner.v1 import assigner_pb2
from dsclient import local_socket
from services.consumer_sidecar import dead_letter, kafka_config
from services.consumer_sidecar.acks import GivenUp
from services.consumer_sidecar.backpressure_watch import watch_backpressure
from services.consumer_sidecar.client_access import AccessInterceptor
from services.consumer_sidecar.events import (
    CommitEvents,
    FetcherEvents,
    LeaseCommitEvents,
    LeaseEvents,
    RedeliveryEvents,
    SessionEvents,
    nothing,
)
from services.consumer_sidecar.fault_emitters import SidecarFaults
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.frame_socket import FrameListener
from services.consumer_sidecar.idle_waits import external_sweep_interval
from services.consumer_sidecar.kafka_callbacks import KafkaCallbacks
from services.consumer_sidecar.kafka_fenced_commits import (
    COMMIT_PRODUCER_CONFIG,
    FencedCommitter,
    LeaseFenced,
)
from services.consumer_sidecar.kafka_group_membership import group_topics
from services.consumer_sidecar.kafka_group_mode import KafkaGroupMode
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.live_config import LiveConfig
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.ordering import Ordering
from services.consumer_sidecar.partitions import PartitionTable, Redelivery
from services.consumer_sidecar.read_budget import ReadBudget
from services.consumer_sidecar.reader import RangeReaders
from services.consumer_sidecar.rpc import StreamServicer, add_to_server
from services.consumer_sidecar.serving import DataSignal, Serving
from services.consumer_sidecar.session import ConfigStatus, SessionClient, SessionIdentity
from services.consumer_sidecar.settings import SidecarSettings
from services.consumer_sidecar.shm_delivery import SharedMemory
from services.runtime.grpcserver import GrpcServer, GrpcService
from services.runtime.http import Route
from services.runtime.kafka import (
    KafkaProbe,
    consumer_config,
    new_admin,
    new_consumer,
    new_producer,
)
from services.runtime.lifecycle import Dependency
from services.runtime.reporter import reporter_for
from services.runtime.tasks import TaskSet
from services.runtime.topic_partition import TP
from services.runtime.topics import TopicSpec, ensure_topic

log = structlog.get_logger(__name__)


class SidecarApp:
    name = "ds-sidecar"

    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        # Tasks of the sidecar's lifetime: cancelled by close().
        self._tasks = TaskSet("sidecar task failed")
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.metrics = SidecarMetrics(
            self.registry,
            settings.group,
            enabled=settings.metrics_enabled,
            max_client_ids=settings.metrics_max_client_ids,
            client_idle_seconds=settings.metrics_client_idle_seconds,
        )
        self.data = DataSignal()
        # Every part reports through the events interfaces (events.py) built here, once:
        # the faults, the data signal, the group's live settings, and the metrics when
        # enabled. The metrics' scrape-time views are always on (_watch_metrics).
        metrics = self.metrics if self.metrics.enabled else None
        self.table = PartitionTable(
            settings.buffer_max_bytes, time.monotonic, on_unblocked=self.data.notify
        )
        # The sidecars' dead-letter topic; a group's config may name its own (live).
        self.dead_letter_default = dead_letter.topic_for(settings.dead_letter_topic, settings.group)
        self.default_redelivery = Redelivery(
            settings.visibility_timeout_seconds,
            settings.max_deliveries,
            dead_letter=bool(self.dead_letter_default),
        )
        self.table.redelivery = self.default_redelivery
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe = KafkaProbe(settings, client_id=kafka_config.fetch_client_id(settings))
        self.reporter = reporter_for(settings, "sidecar", settings.id, self.registry)
        self.faults = SidecarFaults(self.reporter, settings.group, settings.id)
        self.kafka_callbacks = KafkaCallbacks(
            self.table, self.metrics, self.faults, on_broker_loss=self._broker_loss
        )
        fetch_config = kafka_config.fetch_config(
            settings, on_stats=self.kafka_callbacks.on_stats, on_error=self.kafka_callbacks.on_error
        )
        commit_consumer = new_consumer(
            settings,
            group=settings.group,
            client_id=f"ds-sidecar-{settings.id}-commit",
            error_cb=self.kafka_callbacks.on_error,
        )
        # The lease producers exist whatever the fencing: the group's commit_fencing (or,
        # when it says nothing, this setting) picks each lease's at its grant, live.
        kafka_fenced = settings.commit_fencing == "kafka"
        self.commits = OffsetCommitter(
            self.table,
            sidecar_id=settings.id,
            consumer=commit_consumer,
            fenced=self._fenced_committer(commit_consumer),
            external_check_seconds=settings.external_check_interval_seconds,
            events=CommitEvents(
                on_commit_request=metrics.committed if metrics else nothing,
                on_fenced=self._fenced_at_kafka,
            ),
        )
        self.fetcher = Fetcher(
            Consumer(fetch_config),
            self.table,
            self.commits,
            batch=settings.consume_batch,
            on_data=self.data.notify,
            on_error=self.kafka_callbacks.on_error,
            prefetch_bytes=int(fetch_config["queued.max.messages.kbytes"]) * 1024,
            events=self._fetcher_events(metrics),
            last_read=self.data.last_read,  # nobody reads for a while: the loop parks
        )
        self.data.on_read = self.fetcher.reader_came
        self.fetcher.reset_to_end = kafka_config.resets_to_end(settings)
        self.dead_letters: dead_letter.DeadLetters | None = None  # made on first use
        self._frames: FrameListener | None = None  # grpc_services makes it
        self.keeper = LeaseKeeper(
            self.table,
            self.fetcher,
            self.commits,
            commit_interval=settings.commit_interval_seconds,
            commit_max_acks=settings.commit_max_acks,
            kafka_fenced=kafka_fenced,
            events=self._lease_events(metrics),
        )
        self.session = SessionClient(
            SessionIdentity(
                sidecar_id=settings.id,
                group=settings.group,
                endpoint="",  # known once the gRPC port is bound (on_ready)
                zone=settings.zone,
                capacity=settings.capacity,
            ),
            settings.assigner,
            self.keeper,
            safety_margin=settings.lease_safety_margin_seconds,
            delivery_margin=settings.delivery_margin_seconds,
            consul=settings.consul,
            settings=settings.connection,
            events=self._session_events(metrics),
            config_status=self._config_status,
            client_activity=self.metrics.clients.activity,
        )
        self.kafka_group = KafkaGroupMode(
            self.table,
            self.fetcher,
            self.commits,
            settings,
            on_stats=self.kafka_callbacks.on_stats,
            on_error=self.kafka_callbacks.on_error,
            group_topics=lambda: group_topics(self.session.follower, settings.group),
            spawn=self._tasks.spawn,
            drop_leases=self.keeper.drop_all,
            events=metrics,
        )
        self.live_config = LiveConfig(
            replace=self._replace_consumer,
            effective=lambda group: kafka_config.shown_config(
                kafka_config.fetch_config(
                    settings, group_config=group, kafka_group=self.session.kafka_group
                )
            ),
            kafka_group=lambda: self.session.kafka_group,
            on_change=self.session.config_changed,
        )
        self.serving = Serving(
            self.table,
            self.keeper,
            self.data,
            group=settings.group,
            sidecar_id=settings.id,
            connected=lambda: self.session.connected,
            consumer_config=lambda: self.live_config.applied.effective,
            config_version=lambda: self.live_config.applied.version,
            read_budget=ReadBudget(
                settings.read_range_max_streams,
                int(settings.buffer_max_bytes * settings.read_range_buffer_share),
            ),
        )
        self._watch_metrics()

    # ---- the events interfaces (events.py) ---------------------------------------------

    def _fetcher_events(self, metrics: SidecarMetrics | None) -> FetcherEvents:
        # The not-fetching gaps (metrics.gaps) are made by _watch_metrics, after the fetcher
        # (their view reads its last poll): the hooks look them up when called.
        return FetcherEvents(
            on_poll=metrics.polls.polled if metrics else nothing,
            on_consumed=metrics.consumed if metrics else nothing,
            on_fetched=self._gap_fetched if metrics else nothing,
            on_loop=self._gap_tick if metrics else nothing,
            on_gap=self._offset_gap,
        )

    def _gap_fetched(self, tp: TP, at: float, first_timestamp: int) -> None:
        """Fetch thread: records of ``tp`` fetched (the not-fetching and handoff gaps)."""
        if (gaps := self.metrics.gaps) is not None:
            gaps.fetched(tp, at, first_timestamp)

    def _gap_tick(self, at: float) -> None:
        """Fetch thread: a turn of the loop (the gaps of partitions without records)."""
        if (gaps := self.metrics.gaps) is not None:
            gaps.tick(at)

    def _lease_events(self, metrics: SidecarMetrics | None) -> LeaseEvents:
        return LeaseEvents(
            on_lease_change=metrics.lease_changed if metrics else nothing,
            on_lease_settled=metrics.lease_settled if metrics else nothing,
            on_partition_lost=metrics.partitions_lost if metrics else nothing,
            on_renewed=self.data.notify,
            commits=LeaseCommitEvents(
                on_commit=self.faults.commit,
                # A lease verified after a stall: its records can be taken again.
                on_verified=self.data.notify,
                on_external=self._external_found,  # a heartbeat now, metrics or not
            ),
            redelivery=RedeliveryEvents(
                # Records due again can be taken: the Streams wait for the signal, not a tick.
                on_redelivery=self._redelivered_counted if metrics else self._redelivered,
                on_given_up=self._given_up,
                on_dead_letter=self._dead_letter,
            ),
        )

    def _session_events(self, metrics: SidecarMetrics | None) -> SessionEvents:
        return SessionEvents(
            on_accepted=self._accepted,
            on_config=self._offer_config,
            on_delivery_policy=self._delivery_policy,
            on_external_changes=self._external_changes,
            on_ordering=self._ordering,
            on_commit_fencing=self._commit_fencing,
            on_heartbeat_sent=metrics.heartbeat_sent if metrics else nothing,
            on_heartbeat_acked=metrics.heartbeat_acked if metrics else nothing,
            on_join=metrics.joined if metrics else nothing,
            on_sync=metrics.synced if metrics else nothing,
        )

    def _watch_metrics(self) -> None:
        """The metrics' scrape-time views (always; the counting hooks are the events')."""
        fetcher = self.fetcher
        self.metrics.watch(self.table, lambda: fetcher.last_poll, lambda: self.session.connected)

    def _redelivered(self, _why: str, _records: int) -> None:
        self.data.notify()

    def _redelivered_counted(self, why: str, records: int) -> None:
        self.data.notify()
        self.metrics.redelivered(why, records)

    def _external_found(self) -> None:
        self.session.external_found()

    def _accepted(self, accepted: assigner_pb2.SessionAccepted) -> None:
        """Every SessionAccepted: kafka_group mode starts or stops with the group's mode."""
        self.kafka_group.on_accepted(accepted, kafka_group=self.session.kafka_group)

    def _offer_config(self, version: int, config: dict[str, str]) -> None:
        """The group's consumer config, from a join or a ConfigUpdate (live_config.py)."""
        self.live_config.offer(version, config)

    async def _replace_consumer(self, group_config: dict[str, str]) -> None:
        """A new fetch consumer for the group's changed consumer_config (live_config.py):
        in place at the buffer's positions (leased), or a new member under the same static
        id (kafka_group). KafkaException if librdkafka refuses it; the old one runs on."""
        if self.session.kafka_group:
            await self.kafka_group.apply(group_config)
            return
        config = kafka_config.fetch_config(
            self.settings,
            on_stats=self.kafka_callbacks.on_stats,
            on_error=self.kafka_callbacks.on_error,
            group_config=group_config,
        )
        moved = await self.fetcher.run(self.fetcher.replace_consumer, config)
        self.fetcher.reset_to_end = kafka_config.resets_to_end(self.settings, group_config)
        log.info("fetch consumer replaced for the group's consumer config", partitions=moved)

    def _broker_loss(self) -> None:
        """Fetch thread: the fetch consumer has known no broker for a while (broker_loss.py):
        a new one takes over, on the event loop's turn."""
        if self._loop is None:
            self.kafka_callbacks.replaced()  # not serving yet: look again
            return
        renew = self._renew_consumer()
        try:
            self._loop.call_soon_threadsafe(self._tasks.spawn, renew, "renew")
        except RuntimeError:  # the loop is closed: stopping
            renew.close()

    async def _renew_consumer(self) -> None:
        """Leased mode: the fetch consumer made anew in place, from the group's config of
        now (what a live config change does). kafka_group mode: its consumer is the
        group's member; not replaced here (restart the sidecar)."""
        try:
            if self.session.kafka_group:
                log.error(
                    "the fetch consumer knows no broker; in kafka_group mode it is not "
                    "replaced: restart this sidecar"
                )
                return
            await self._replace_consumer(self.live_config.applied.group)
        except KafkaException as exc:
            log.warning("fetch consumer not replaced; trying again", error=str(exc))
        finally:
            self.kafka_callbacks.replaced()

    def _config_status(self) -> ConfigStatus:
        rejected = self.live_config.rejected
        version = self.live_config.applied.version
        return version, (rejected.version, rejected.reason) if rejected is not None else None

    def _given_up(self, tp: TP, epoch: int, given_up: GivenUp) -> None:
        """A record given up past its delivery limit: POISON_RECORD, counted."""
        self.faults.given_up(tp, epoch, given_up)
        if self.metrics.enabled:
            self.metrics.gave_up(given_up.hi - given_up.lo)

    def _fenced_committer(self, commit_consumer: Consumer) -> FencedCommitter:
        """commit_fencing: kafka: a transactional producer per held lease; the group
        metadata is the commit consumer's (generation -1: an assign()-only consumer)."""
        settings = self.settings

        def make_producer(transactional_id: str) -> Any:
            return new_producer(
                settings,
                client_id=f"ds-sidecar-{settings.id}-lease",
                overrides={**COMMIT_PRODUCER_CONFIG, "transactional.id": transactional_id},
                error_cb=self.kafka_callbacks.on_error,
            )

        return FencedCommitter(
            settings.group, make_producer, commit_consumer.consumer_group_metadata
        )

    def _fenced_at_kafka(self, fenced: LeaseFenced) -> None:
        """Commit thread: Kafka fenced a lease (a newer holder): drop it on the loop."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.keeper.fenced_by_kafka, fenced)

    def _dead_letter_to(self, topic: str) -> None:
        """Event loop: records given up from now on go to ``topic`` (created at once);
        the writer and its depth watch start with the first topic."""
        if self.dead_letters is None:
            self.dead_letters = self._dead_letters(topic)
            if self.metrics.enabled:
                self._tasks.spawn(
                    self.dead_letters.watch_depth(
                        self.settings.dead_letter_check_interval_seconds,
                        self.metrics.dead_letter_depth,
                    ),
                    "dead-letter-depth",
                )
        self.dead_letters.retarget(topic)

    def _dead_letters(self, topic: str) -> dead_letter.DeadLetters:
        """The dead-letter writer (its own reader and idempotent producer), hooked to the
        keeper: parked records are written, then acked (dead_letter.py)."""
        settings = self.settings
        reader = Consumer(
            consumer_config(
                settings,
                group=f"{settings.group}.ds-dead-letter",
                client_id=f"ds-sidecar-{settings.id}-dead-letter",
                overrides={"enable.partition.eof": True},
            )
        )
        producer = new_producer(settings, client_id=f"ds-sidecar-{settings.id}-dead-letter")
        writer = dead_letter.DeadLetterWriter(
            reader, producer, topic, settings.group, ensure=self._ensure_dead_letter_topic
        )
        letters = dead_letter.DeadLetters(
            writer,
            self.keeper.holds,
            self.keeper.dead_lettered,
            on_written=self.metrics.dead_lettered if self.metrics.enabled else lambda _n: None,
        )

        return letters

    def _dead_letter(self, tp: TP, epoch: int, given_up: GivenUp, why: str) -> None:
        """A given-up range parked for the dead-letter topic: to its writer (none before the
        first topic is known: nothing is parked then)."""
        if self.dead_letters is None:
            return
        job = dead_letter.DeadLetterJob(
            tp, epoch, given_up.lo, given_up.hi, given_up.deliveries, given_up.holder[0], why
        )
        self.dead_letters.submit(job)

    def _ensure_dead_letter_topic(self, topic: str) -> None:
        """Blocking (the dead-letter thread): ``topic``, created unless it exists."""
        admin = new_admin(self.settings, client_id=f"ds-sidecar-{self.settings.id}-admin")
        spec = TopicSpec(topic, partitions=self.settings.dead_letter_partitions)
        if ensure_topic(admin, spec):
            log.info("dead-letter topic created", dead_letter_topic=topic)

    def _offset_gap(self, tp: TP, lo: int, hi: int, reason: str) -> None:
        """Fetch thread: a position outside the log moved: OFFSET_GAP, counted, logged."""
        log.warning(
            "position outside the partition's log: fetching moved",
            topic=tp.topic,
            partition=tp.partition,
            from_offset=lo,
            to_offset=hi,
            reason=reason,
        )
        self.faults.offset_gap(tp, lo, hi, reason)
        if self.metrics.enabled and reason != "truncated":
            self.metrics.offset_gap(tp.topic, tp.partition, hi - lo)

    def _delivery_policy(
        self, visibility: float | None, max_deliveries: int, dead_letter_topic: str = ""
    ) -> None:
        """The group's redelivery settings (SessionAccepted, ConfigUpdate), live; its
        dead-letter topic, else the sidecar's, else none."""
        topic = dead_letter_topic or self.dead_letter_default
        policy = Redelivery.of_group(visibility, max_deliveries, self.default_redelivery)
        policy = dataclasses.replace(policy, dead_letter=bool(topic))
        if topic:
            self._dead_letter_to(topic)
        if policy != self.table.redelivery:
            log.info(
                "redelivery policy",
                visibility_timeout=policy.visibility,
                max_deliveries=policy.max_deliveries,
                dead_letter_topic=topic,
            )
        self.table.redelivery = policy

    def _ordering(self, mode: str) -> None:
        """The group's ordering (SessionAccepted, ConfigUpdate), live: applies to the next
        take (ordering.py)."""
        ordering = Ordering(mode)
        if ordering != self.table.ordering:
            log.info("ordering", ordering=ordering.value, before=self.table.ordering.value)
        self.table.ordering = ordering
        self.data.notify()  # records held back may go now (a switch to unordered)

    def _commit_fencing(self, mode: str) -> None:
        """The group's commit_fencing (SessionAccepted, ConfigUpdate; "" = this sidecar's
        setting), live: each partition granted from now on takes it; a lease held keeps the
        fencing it was granted under until it ends (the assigner refuses a change away
        from kafka, services/assigner/admin/validation.py)."""
        kafka_fenced = (mode or self.settings.commit_fencing) == "kafka"
        if kafka_fenced != self.keeper.kafka_fenced:
            log.info(
                "commit fencing: applies to the next grant of each partition",
                commit_fencing="kafka" if kafka_fenced else "lease",
                group_setting=mode or "(unset: this sidecar's)",
            )
        self.keeper.kafka_fenced = kafka_fenced

    def _external_changes(self, mode: str) -> None:
        """The group's external_offset_changes (SessionAccepted, ConfigUpdate), live."""
        if mode != self.commits.external_changes:
            log.info("external offset changes", mode=mode)
        self.commits.external_changes = mode

    def grpc_interceptors(self) -> Sequence[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
        """Client-access metrics: every StreamService call by client, method and code."""
        if not self.metrics.enabled:
            return ()
        return (AccessInterceptor(self.metrics.clients),)

    # ---- Service protocol -----------------------------------------------------------------

    def grpc_services(self) -> Sequence[GrpcService]:
        readers = RangeReaders(
            functools.partial(kafka_config.reader_config, self.settings),
            # A thread per stream it may run, and room for watermark queries and closes.
            max_workers=self.settings.read_range_max_streams + 2,
            prefetch_bytes=self.settings.read_range_prefetch_bytes,
        )
        clients = self.metrics.clients if self.metrics.enabled else None
        socket = self.settings.local_socket_path
        # StreamOpen.frame_socket: a socket file beside the local one, from the first
        # stream that asks for it (frame_socket.py).
        self._frames = FrameListener(socket.parent, self.settings.id) if socket else None
        return [
            GrpcService(
                "dataservice.sidecar.v1.StreamService",
                StreamServicer(
                    self.serving,
                    readers,
                    clients=clients,
                    shared_memory=self._shared_memory(),
                    frames=self._frames,
                ),
                add_to_server,
            )
        ]

    def _shared_memory(self) -> SharedMemory | None:
        """Where DELIVERY_FORMAT_ARROW_SHM streams get their segments: beside the local
        socket; None without one (or with shm_segment_bytes 0)."""
        path, capacity = self.settings.local_socket_path, self.settings.shm_segment_bytes
        if path is None or capacity == 0:
            return None
        return SharedMemory(path.parent, capacity)

    def dependencies(self) -> Sequence[Dependency]:
        return [self._probe]

    def http_routes(self) -> Mapping[str, Route]:
        return {}

    @property
    def served_group(self) -> str:
        """The group this sidecar serves: what its Status call reveals, so what the
        authorization of Status checks (``reader:GROUP``)."""
        return self.settings.group

    @property
    def local_socket_path(self) -> Path | None:
        """The Unix domain socket the StreamService is also served on, for the
        application in the pod (``uds_dir``); None: TCP only."""
        return self.settings.local_socket_path

    def instance_meta(self) -> Mapping[str, str]:
        return {"group": self.settings.group, "sidecar_id": self.settings.id}

    async def on_ready(self, server: GrpcServer) -> None:
        self._loop = asyncio.get_running_loop()
        self.data.bind_loop(self._loop)
        endpoint = f"{self.settings.advertised}:{server.port}"
        self.session.identity = SessionIdentity(
            sidecar_id=self.settings.id,
            group=self.settings.group,
            endpoint=endpoint,
            zone=self.settings.zone,
            capacity=self.settings.capacity,
            local_endpoint=local_socket.target(server.local_socket) if server.local_socket else "",
        )
        if server.local_socket is not None:  # ours now: what a killed run left is stale
            swept = local_socket.sweep_segments(server.local_socket.parent, self.settings.id)
            if swept:
                log.info("stale shared-memory segments removed", files=swept)
        if self.dead_letter_default:
            self._dead_letter_to(self.dead_letter_default)
        self.fetcher.start()
        self._tasks.spawn(self.live_config.run(), "live-config")
        self._tasks.spawn(self.session.run(), "session")
        self._tasks.spawn(self.keeper.committer.commit_loop(), "commits")
        self._tasks.spawn(self.keeper.redeliverer.redelivery_loop(), "redelivery")
        self._tasks.spawn(
            self.keeper.committer.external_check_loop(
                external_sweep_interval(self.settings.external_check_interval_seconds)
            ),
            "external-commits",
        )
        self.reporter.start()
        self._tasks.spawn(watch_backpressure(self.table, self.faults), "backpressure")

    async def drain(self) -> None:
        """SIGTERM: hand every partition off cooperatively (commit acked offsets first)."""
        if self._loop is None:
            return
        # kafka_group: stop delivering, wait for in-flight acks, commit; then leave.
        await self.kafka_group.release_all()
        await self.session.leave(timeout=self.settings.shutdown_grace_seconds)

    def _stop_kafka(self) -> None:
        """Blocking: the committer (the commit in progress; its consumer and producers),
        then the fetch loop."""
        self.commits.stop()
        self.fetcher.stop()

    async def close(self) -> None:
        await self._tasks.cancel_all()
        if self._frames is not None:
            self._frames.close()
        if self.dead_letters is not None:
            await self.dead_letters.close()
        if self._loop is not None:
            await asyncio.to_thread(self._stop_kafka)
        await asyncio.to_thread(self.reporter.close)
