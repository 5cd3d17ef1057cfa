"""Starting and stopping compatibility mode ``kafka_group`` (ARCHITECTURE §5.6).

The group's mode arrives with the session (``SessionAccepted.mode``). An accepted join of
a kafka_group group switches the fetch consumer from ``assign()`` to ``subscribe()`` to
the group's topics, with :class:`ClassicMembership` mapping Kafka's rebalances onto the
partition table (:mod:`services.consumer_sidecar.kafka_group_membership`); leases still
held are dropped first (the assigner revoked them all before it switched the group). An
accepted join of a leased group while subscribed switches back: the consumer
``unsubscribe()``s — Kafka's revoke hands every partition back with its acked offsets
committed, and the member leaves the group at once, static membership or not — and a
fresh ``assign()`` consumer takes its place; the assigner grants leases once Kafka's group is empty.

A later change of the group's ``consumer_config`` (``live_config.py``) takes a new
subscribe()d consumer: :meth:`KafkaGroupMode.apply` hands the partitions back as on a
revoke and joins again under the same static ``group.instance.id``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_config import fetch_config
from services.consumer_sidecar.kafka_group_membership import ClassicMembership, RebalanceEvents
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.consumer_config import ALLOWED

log = structlog.get_logger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class KafkaGroupMode:
    def __init__(
        self,
        table: PartitionTable,
        fetcher: Fetcher,
        commits: OffsetCommitter,
        settings: SidecarSettings,
        *,
        on_stats: Callable[[str], None],
        on_error: Callable[[KafkaError], None],
        group_topics: Callable[[], Awaitable[list[str]]],
        spawn: Spawn,
        drop_leases: Callable[[], Awaitable[None]] | None = None,
        events: RebalanceEvents | None = None,
    ) -> None:
        """``commits``: the sidecar's committer (the rebalance handlers' commits go through
        it, on the fetch thread); ``on_stats``, ``on_error``: librdkafka's callbacks for the
        new consumer, as for the one it replaces; ``group_topics``: the group's topics from
        the assigner (an older assigner does not send them with SessionAccepted); ``spawn``:
        runs the start as a task the sidecar cancels when it closes; ``drop_leases``: drops
        what is left of leased mode before subscribing (the lease keeper's); ``events``: what
        the rebalance callbacks report (the metrics, when enabled)."""
        self._table = table
        self._fetcher = fetcher
        self._commits = commits
        self._settings = settings
        self._on_stats = on_stats
        self._on_error = on_error
        self._group_topics = group_topics
        self._spawn = spawn
        self._drop_leases = drop_leases
        # Switches in the order the session asked for them (each awaits the fetch thread).
        self._switching = asyncio.Lock()
        # Kafka's rebalance callbacks onto the partition table, while in kafka_group mode;
        # what they report.
        self.membership: ClassicMembership | None = None
        self._events = events
        # The group's consumer_config the subscribed consumer runs (None: not subscribed yet),
        # the topics it subscribed to, and when the first subscribe() is done.
        self.running: dict[str, str] | None = None
        self._topics: list[str] = []
        self._started: asyncio.Future[None] | None = None

    @property
    def active(self) -> bool:
        return self.membership is not None

    def on_accepted(self, accepted: assigner_pb2.SessionAccepted, *, kafka_group: bool) -> None:
        """Every (re-)join; ``kafka_group`` is the session's mode. In kafka_group mode
        while not subscribed, Kafka consumption switches to subscribe(); in leased mode
        while subscribed, back to assign()."""
        if kafka_group and self.membership is None:
            self.membership = ClassicMembership(
                self._table,
                self._fetcher,
                self._commits,
                drain_timeout=self._settings.drain_timeout_seconds,
                events=self._events,
            )
            self._started = asyncio.get_running_loop().create_future()
            self._spawn(
                self._start(self.membership, dict(accepted.consumer_config), list(accepted.topics)),
                "kafka-group",
            )
        elif not kafka_group and self.membership is not None:
            membership, self.membership = self.membership, None
            self.running = None
            self._spawn(self._stop(membership), "kafka-group-stop")

    async def _start(
        self, membership: ClassicMembership, group_config: dict[str, str], topics: list[str]
    ) -> None:
        # Only what the sidecar may run of it (as live_config.py offers it, too).
        group_config = {k: v for k, v in group_config.items() if k in ALLOWED}
        try:
            async with self._switching:
                if self._drop_leases is not None:
                    await self._drop_leases()
                # The assigner sends the topics with SessionAccepted; an older one does not.
                self._topics = topics or await self._group_topics()
                try:
                    config = self._config(group_config)
                    await self._fetcher.run(
                        self._fetcher.use_classic, config, self._topics, membership
                    )
                except KafkaException as exc:
                    # The group's config does not build here: consume with the sidecar's own,
                    # and let the config change report the refusal (it tries it again).
                    log.error(
                        "kafka_group mode: the group's consumer_config failed", error=str(exc)
                    )
                    group_config = {}
                    config = self._config(group_config)
                    await self._fetcher.run(
                        self._fetcher.use_classic, config, self._topics, membership
                    )
                self.running = group_config
            log.info(
                "kafka_group mode: subscribed",
                topics=self._topics,
                group_instance_id=self._settings.id,
                assignor=config["partition.assignment.strategy"],
            )
        finally:
            if self._started is not None and not self._started.done():
                self._started.set_result(None)

    def _config(self, group_config: dict[str, str]) -> dict[str, Any]:
        return fetch_config(
            self._settings,
            on_stats=self._on_stats,
            on_error=self._on_error,
            group_config=group_config,
            kafka_group=True,
        )

    async def apply(self, group_config: dict[str, str]) -> None:
        """Run the group's ``group_config`` (a live config change): nothing to do if the
        subscribed consumer already runs it; else a new consumer joins in its place (see
        :meth:`Fetcher.resubscribe`). KafkaException if librdkafka refuses it: the old
        consumer keeps running (or, should a refusal come after the hand-back, one built
        again from the previous config)."""
        if self._started is not None:
            await asyncio.shield(self._started)
        async with self._switching:
            membership, previous = self.membership, self.running
            if membership is None or previous is None:
                raise KafkaException(
                    KafkaError(KafkaError._STATE, "kafka_group mode is not subscribed")
                )
            if group_config == previous:
                return
            try:
                await self._fetcher.run(
                    self._fetcher.resubscribe, self._config(group_config), self._topics, membership
                )
            except KafkaException:
                if self._fetcher.subscribed:
                    raise  # refused before anything changed
                await self._fetcher.run(
                    self._fetcher.resubscribe, self._config(previous), self._topics, membership
                )
                raise
            self.running = dict(group_config)
        log.info("kafka_group mode: joined again with the new consumer config")

    async def _stop(self, membership: ClassicMembership) -> None:
        """Back to leased mode: hand every partition back through Kafka (drain, commit),
        leave Kafka's group, and fetch with a fresh assign() consumer."""
        config = fetch_config(self._settings, on_stats=self._on_stats, on_error=self._on_error)
        async with self._switching:
            left = await self._fetcher.run(self._fetcher.use_assign, config, membership)
        log.info("leased mode: left Kafka's group; fetching assigned partitions", dropped=left)

    async def release_all(self) -> None:
        """Graceful stop in kafka_group mode: stop delivering, wait for in-flight acks
        (clients still send them here), commit. The consumer closes with the fetcher; as a
        static member it keeps its place in the Kafka group for session.timeout.ms, so a
        quick restart moves no partition. Nothing to do in leased mode."""
        if self.membership is not None:
            await self._fetcher.run(self.membership.release_all)
