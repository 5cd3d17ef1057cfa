"""Starting and stopping compatibility mode ``kafka_group`` (ARCHITECTURE §5.6).

The group's mode arrives with the session (``SessionAccepted.mode``). The first accepted
join of a kafka_group group switches the fetch consumer from ``assign()`` to
``subscribe()`` to the group's topics, with :class:`ClassicMembership` mapping Kafka's
rebalances onto the partition table (:mod:`services.consumer_sidecar.classic`). The mode
never changes while the process runs; a leased group never gets here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog
from confluent_kafka import KafkaError

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.classic import ClassicMembership
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_config import fetch_config
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.settings import SidecarSettings

log = structlog.get_logger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class KafkaGroupMode:
    def __init__(
        self,
        table: PartitionTable,
        fetcher: Fetcher,
        settings: SidecarSettings,
        *,
        on_stats: Callable[[str], None],
        on_error: Callable[[KafkaError], None],
        group_topics: Callable[[], Awaitable[list[str]]],
        spawn: Spawn,
    ) -> None:
        """``on_stats``, ``on_error``: librdkafka's callbacks for the new consumer, as
        for the one it replaces; ``group_topics``: the group's topics from the assigner (an
        older assigner does not send them with SessionAccepted); ``spawn``: runs the start
        as a task the sidecar cancels when it closes."""
        self._table = table
        self._fetcher = fetcher
        self._settings = settings
        self._on_stats = on_stats
        self._on_error = on_error
        self._group_topics = group_topics
        self._spawn = spawn
        # Kafka's rebalance callbacks onto the partition table, once in kafka_group mode.
        self.membership: ClassicMembership | None = None

    @property
    def active(self) -> bool:
        return self.membership is not None

    def on_accepted(self, accepted: assigner_pb2.SessionAccepted, *, kafka_group: bool) -> None:
        """Every (re-)join; ``kafka_group`` is the session's mode. The first one in
        kafka_group mode switches Kafka consumption to subscribe()."""
        if not kafka_group or self.membership is not None:
            return
        self.membership = ClassicMembership(
            self._table, self._fetcher, drain_timeout=self._settings.drain_timeout_seconds
        )
        self._spawn(
            self._start(self.membership, dict(accepted.consumer_config), list(accepted.topics)),
            "kafka-group",
        )

    async def _start(
        self, membership: ClassicMembership, group_config: dict[str, str], topics: list[str]
    ) -> None:
        # The assigner sends the topics with SessionAccepted; an older one does not.
        topics = topics or await self._group_topics()
        config = fetch_config(
            self._settings,
            on_stats=self._on_stats,
            on_error=self._on_error,
            group_config=group_config,
        )
        await self._fetcher.run(self._fetcher.use_classic, config, topics, membership)
        log.info(
            "kafka_group mode: subscribed",
            topics=topics,
            group_instance_id=self._settings.id,
            assignor=config["partition.assignment.strategy"],
        )

    async def release_all(self) -> None:
        """Graceful stop in kafka_group mode: stop delivering, wait for in-flight acks
        (clients still send them here), commit. The consumer closes with the fetcher; as a
        static member it keeps its place in the Kafka group for session.timeout.ms, so a
        quick restart moves no partition. Nothing to do in leased mode."""
        if self.membership is not None:
            await self._fetcher.run(self.membership.release_all)
