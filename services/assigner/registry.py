"""The groups this replica serves while it leads: created, updated, restored and looked up.

The servicers and the ``/ui`` pages reach the groups through this object alone, never
through the app. It does no Kafka I/O of its own: the topics' partitions and the durable
writes come through the narrow objects it is given (:class:`TopicMetadata`,
:class:`~services.assigner.groups.GroupStore`), so it runs against a broker in the
assigner and without one in the unit tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import structlog

from dsclient.reasons import DsError, Reason
from services.assigner.groups import GroupRuntime, GroupStore
from services.assigner.metrics import AssignerMetrics
from services.assigner.settings import AssignerSettings, GroupSeed
from services.assigner.state import GroupRecord, StateSnapshot
from services.runtime.reporter import FaultReporter
from services.runtime.tick_wake import TickWake
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)


class TopicMetadata(Protocol):
    """Kafka's view of the topics (:class:`~services.assigner.kafka_cluster.KafkaCluster`)."""

    async def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        """Every partition of ``topics``; DsError TOPIC_NOT_FOUND or KAFKA_UNAVAILABLE."""
        ...


class GroupRegistry:
    """Name -> :class:`GroupRuntime` of the groups this replica serves, and whether it serves.

    A replica serves from the moment it leads and has loaded the state topic
    (:meth:`start_serving`) until it steps down (:meth:`stop_serving`, then :meth:`clear`).
    Lookups while it does not serve are SERVICE_NOT_READY (retryable).
    """

    def __init__(
        self,
        settings: AssignerSettings,
        metrics: AssignerMetrics,
        store: GroupStore,
        topics: TopicMetadata,
        *,
        is_leader: Callable[[], bool],
        faults: FaultReporter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = store
        self.topics = topics
        self.is_leader = is_leader
        self.faults = faults
        self.clock = clock
        self._groups: dict[str, GroupRuntime] = {}
        # The last epochs of deleted groups: a group created again under a name starts
        # from them, so an epoch never goes back (a fenced holder stays fenced).
        self._deleted_epochs: dict[str, dict[TopicPartition, int]] = {}
        self.serving = False
        self._serving = asyncio.Event()  # set while serving, for calls that wait for it
        self.wake = TickWake(clock)  # the tick loop's: groups poke it (tick_wake.py)

    # ---- serving ----------------------------------------------------------------------

    def start_serving(self) -> None:
        self.serving = True
        self._serving.set()

    def stop_serving(self) -> None:
        """Refuse lookups from now on; the groups stay until :meth:`clear`."""
        self.serving = False
        self._serving.clear()

    def clear(self) -> None:
        """Close every group (its streams end, its watchers are told) and forget it."""
        for group in self._groups.values():
            group.close()
            self.metrics.forget_group(group.name)
        self._groups.clear()
        self._deleted_epochs.clear()

    # ---- lookups ----------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._groups)

    def get(self, name: str) -> GroupRuntime | None:
        return self._groups.get(name)

    def __iter__(self) -> Iterator[GroupRuntime]:
        """The groups by name (a snapshot: safe across awaits that add groups)."""
        return iter([self._groups[n] for n in self.names()])

    def __len__(self) -> int:
        return len(self._groups)

    def group(self, name: str) -> GroupRuntime:
        if not self.serving:
            raise DsError(Reason.SERVICE_NOT_READY, "the assigner is not serving groups yet")
        if not name:
            raise DsError(
                Reason.INVALID_FIELD, "group: must not be empty", metadata={"field": "group"}
            )
        group = self._groups.get(name)
        if group is None:
            raise DsError(
                Reason.GROUP_NOT_FOUND, f"group {name!r} does not exist", metadata={"group": name}
            )
        return group

    async def serving_group(self, name: str, wait: float = 5.0) -> GroupRuntime:
        """Like :meth:`group`, but a call that reaches a just-elected leader while it is
        still loading its state waits for it (bounded) instead of bouncing to backoff."""
        await self._until_serving(wait)
        return self.group(name)

    async def serving_groups(self, wait: float = 5.0) -> list[GroupRuntime]:
        """Every group, by name, for a listing: like :meth:`serving_group`, a just-elected
        leader still loading its state is waited for, and a replica that does not serve is
        SERVICE_NOT_READY, never an empty list (which would read as "no groups")."""
        await self._until_serving(wait)
        if not self.serving:
            raise DsError(Reason.SERVICE_NOT_READY, "the assigner is not serving groups yet")
        return list(self)

    async def _until_serving(self, wait: float) -> None:
        if not self.serving and self.is_leader():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._serving.wait(), wait)

    # ---- changes ----------------------------------------------------------------------

    async def create_group(self, record: GroupRecord) -> GroupRuntime:
        """The group ``record`` describes, durable first. The same settings again answer
        the existing group; other settings are GROUP_ALREADY_EXISTS; a topic that does not
        exist is TOPIC_NOT_FOUND."""
        existing = self._groups.get(record.name)
        if existing is not None:
            if _settings(existing.record) == _settings(record):
                return existing  # idempotent: the same request again
            raise DsError(
                Reason.GROUP_ALREADY_EXISTS,
                f"group {record.name!r} exists with other settings",
                metadata={"group": record.name},
            )
        partitions = await self.topics.partitions(record.topics)
        await self._store(record)
        group = GroupRuntime(
            record,
            partitions,
            self.settings,
            self.metrics,
            self.store,
            epochs=self._deleted_epochs.pop(record.name, None),
            faults=self.faults,
            clock=self.clock,
        )
        self._add(group)
        log.info(
            "group created", group=record.name, topics=record.topics, partitions=len(partitions)
        )
        return group

    async def update_group(self, record: GroupRecord) -> GroupRuntime:
        """Apply a new configuration to a group (UpdateGroup): durable first, then live.
        New topics' partitions are added; sidecars get consumer config changes pushed."""
        group = self.group(record.name)
        partitions = await self.topics.partitions(record.topics)
        removed = set(group.record.topics) - set(record.topics)
        if removed:
            raise DsError(
                Reason.INVALID_FIELD,
                f"topics: removing topics from a group is not supported ({sorted(removed)})",
                metadata={"field": "group.topics"},
            )
        await self._store(record)
        group.update(record)
        group.set_partitions(partitions, self.clock())
        return group

    async def delete_group(self, name: str, *, force: bool) -> tuple[GroupRuntime, list[str]]:
        """Remove a group (DeleteGroup): durable first (tombstones for its bindings, drains
        and record), then its streams end and its watchers are told. GROUP_HAS_CLIENTS
        while clients are bound unless ``force``; OPERATION_IN_PROGRESS while a reset or a
        mode switch runs. Returns the group removed and the clients that were bound."""
        group = self.group(name)
        group.check_idle()
        clients = sorted(group.clients)
        if clients and not force:
            raise DsError(
                Reason.GROUP_HAS_CLIENTS,
                f"group {name!r} has {len(clients)} bound client(s): "
                f"{', '.join(clients[:20])}{' ...' if len(clients) > 20 else ''}; stop them, "
                "or delete with force",
                metadata={
                    "group": name,
                    "clients": ",".join(clients[:20]),
                    "client_count": str(len(clients)),
                },
            )
        try:
            await self.store.delete_group(name, clients, sorted(group.coordinator.drained))
        except Exception as exc:
            raise DsError(
                Reason.KAFKA_UNAVAILABLE, f"group not deleted (nothing changed): {exc}"
            ) from exc
        if self._groups.get(name) is not group:  # replaced while the write was waited for
            raise DsError(
                Reason.OPERATION_IN_PROGRESS,
                f"group {name!r} changed while it was being deleted; retry",
                metadata={"group": name, "operation": "a deletion"},
            )
        del self._groups[name]
        self._deleted_epochs[name] = {
            tp: lease.epoch for tp, lease in group.coordinator.leases.items()
        }
        group.close()
        self.metrics.forget_group(name)
        log.info("group deleted", group=name, forced=force, clients=len(clients))
        return group, clients

    async def _store(self, record: GroupRecord) -> None:
        try:
            await self.store.put_group(record)
        except Exception as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, f"group not stored: {exc}") from exc

    # ---- taking over ------------------------------------------------------------------

    async def restore(self, snapshot: StateSnapshot, started: float) -> float:
        """The groups of the state topic, with their epochs and bindings. Leases are
        re-learnt from the sidecars re-attaching; until ``started`` + the group's TTL +
        grace nothing is granted, so taking over moves no partition. A kafka-fenced group
        with its own (shorter) TTL settles by it: its sidecars heartbeat and re-attach at
        its pace, and a grant before a stale holder lapsed is fenced by Kafka, not by time.
        Returns when the last group settles."""
        grace = self.settings.lease_grace_seconds
        settled = started + self.settings.lease_ttl_seconds + grace
        for name, epochs in snapshot.epochs.items():
            if name not in snapshot.groups:  # a deleted group's: kept for its next creation
                self._deleted_epochs[name] = dict(epochs)
        for record in snapshot.groups.values():
            try:
                partitions = await self.topics.partitions(record.topics)
            except DsError as err:
                log.error("group from state not restored", group=record.name, error=err.message)
                continue
            ttl = record.lease_ttl_seconds or self.settings.lease_ttl_seconds
            settled = max(settled, started + ttl + grace)
            self._add(
                GroupRuntime(
                    record,
                    partitions,
                    self.settings,
                    self.metrics,
                    self.store,
                    epochs=snapshot.epochs.get(record.name, {}),
                    holders=snapshot.holders.get(record.name, {}),
                    settle_until=started + ttl + grace,
                    clients=snapshot.bindings.get(record.name, set()),
                    drained=snapshot.drained.get(record.name, set()),
                    faults=self.faults,
                    clock=self.clock,
                )
            )
            log.info(
                "group restored",
                group=record.name,
                partitions=len(partitions),
                epochs=len(snapshot.epochs.get(record.name, {})),
            )
        return settled

    async def seed(self, seeds: Iterable[GroupSeed]) -> None:
        """Create the configured groups the state topic does not know; a configured group
        that differs from its durable state keeps the state (UpdateGroup changes it)."""
        for seed in seeds:
            existing = self._groups.get(seed.name)
            if existing is not None:
                if existing.seed != seed:
                    log.warning(
                        "configured group differs from its durable state; the state "
                        "wins (change it with UpdateGroup)",
                        group=seed.name,
                    )
                continue
            try:
                await self.create_group(
                    GroupRecord(
                        name=seed.name,
                        topics=list(seed.topics),
                        mode=seed.mode,
                        consumer_config=dict(seed.consumer_config),
                        balance_strategy=seed.balance_strategy,
                        visibility_timeout_seconds=seed.visibility_timeout_seconds,
                        max_deliveries=seed.max_deliveries,
                        external_offset_changes=seed.external_offset_changes,
                        dead_letter_topic=seed.dead_letter_topic,
                        ordering=seed.ordering,
                        commit_fencing=seed.commit_fencing,
                    )
                )
            except DsError as err:
                log.error("configured group not created", group=seed.name, error=err.message)

    # ---- timers (the app runs them while it leads) ------------------------------------

    def _add(self, group: GroupRuntime) -> None:
        self._groups[group.name] = group
        group.coordinator.on_sooner = self.wake.poke
        self.wake.poke()

    def tick(self) -> float:
        """Expire leases and hold windows of every group (coordinator rules); returns when
        the next tick has work (monotonic seconds; ``inf``: only after an input, which then
        pokes :attr:`wake`)."""
        now = self.clock()
        due = float("inf")
        for group in self:
            try:
                group.tick(now)
                due = min(due, group.due())
            except Exception:
                log.exception("tick failed", group=group.name)
                due = min(due, now)  # tried again at the next tick, as before
        return due

    async def refresh_partitions(self) -> None:
        """Partitions added to a topic are picked up without a restart."""
        for group in self:
            try:
                partitions = await self.topics.partitions(group.seed.topics)
            except DsError as err:
                log.warning("metadata refresh failed", group=group.name, error=err.message)
                continue
            group.set_partitions(partitions, self.clock())


def _settings(record: GroupRecord) -> tuple[object, ...]:
    """What makes two CreateGroup requests for one name "the same group"."""
    return (record.topics, record.mode, record.consumer_config, record.balance_strategy)
