"""Offset resets of a group's partitions, by the assigner (ARCHITECTURE §5.5): the one
path every reset takes — ``ResetOffsets`` (source ``admin``), and a reset made outside the
mesh with Kafka's own tools that the assigner follows (source ``external``).

A leased group's reset keeps the fencing argument of §3.1 as it is, because it is made of
its parts: the partitions are *paused* (revoked from their holders with reason CONFIG and
no drain, reserved for them, granted to nobody: :meth:`GroupCoordinator.pause`), which
ends — like any handoff — with each holder's release or its lease's expiry, so nobody can
commit them any more; only then are the old offsets read, the new ones computed
(:mod:`reset_targets`), a new epoch per partition made durable, the new offsets committed
under it (commit metadata as the sidecars write it), and each partition granted back to
the same holder under that epoch at its new offset. Nothing moves between sidecars and no
client is rebound; the holder drops what it buffered and what was in flight, and answers
acks of the old epoch as stale. A kafka_group group is reset only while Kafka's group has
no members (``kafka-consumer-groups --reset-offsets``' rule), by a plain commit.

A reset runs to its end once it starts, even if its caller gives up (a call's deadline):
stopping between the commit and the grant-back would leave the partitions paused, and
stopping before the commit while a commit is on its way could land the new offsets
behind a holder that already resumed. Each completed reset is an OFFSETS_RESET event.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from dsclient.reasons import DsError, Reason
from services.assigner.admin.reset_request import ResetSpec
from services.assigner.fault_emitters import ResetAudit
from services.assigner.groups import GroupRuntime
from services.assigner.kafka_cluster import GroupMembers
from services.assigner.offsets import Offsets
from services.assigner.reset_targets import PartitionReset, Strategy, plan_resets
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)

PAUSE_POLL_SECONDS = 0.02
# Beyond the longest a holder can keep a paused partition (its lease lapses TTL + grace
# after its last renewal), how long to wait before calling a pause off.
PAUSE_MARGIN_SECONDS = 2.0
UNLEASED_EPOCH = 0  # kafka_group groups have no leases: the sidecars' epoch 0


class ResetKafka(Protocol):
    """What a reset reads from and writes to Kafka (blocking; run in worker threads):
    :class:`~services.assigner.kafka_reset.KafkaResets` in the assigner."""

    def read(self, group: str, partitions: Sequence[TopicPartition]) -> Offsets: ...

    def offsets_for_times(
        self, times: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]: ...

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, int]],
        *,
        fence_leases: bool = False,
    ) -> None: ...


@dataclass(frozen=True)
class ResetOrder:
    """One reset to make: what (the spec), and who asked, for the audit record."""

    spec: ResetSpec
    source: str = "admin"  # or "external": a reset made with Kafka's tools, followed
    actor: str = ""
    request_id: str = ""
    # source "external": each partition's offset before the external commit (the holder's
    # last commit: the one Kafka shows now is already the new one), and who noticed it.
    previous: Mapping[TopicPartition, int] = field(default_factory=dict)
    detected_by: str = ""


@dataclass(frozen=True)
class ResetResult:
    partitions: list[PartitionReset]
    epochs: dict[TopicPartition, int]  # leased groups: each partition's new lease epoch
    applied: bool


class OffsetResets:
    def __init__(
        self,
        kafka: ResetKafka,
        members: GroupMembers,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.members = members
        self.clock = clock

    async def preview(self, group: GroupRuntime, spec: ResetSpec) -> ResetResult:
        """A dry run: the offsets the reset would commit now. Touches nothing."""
        return ResetResult(await self._plan(group.name, spec), {}, applied=False)

    async def reset(self, group: GroupRuntime, order: ResetOrder) -> ResetResult:
        """Reset ``order.spec``'s partitions of ``group`` (module docstring); returns once
        the new offsets are committed and the partitions resumed. OPERATION_IN_PROGRESS
        while another operation runs on the group; GROUP_NOT_EMPTY for a kafka_group group
        with members; KAFKA_UNAVAILABLE when Kafka does not answer (nothing committed)."""
        group.begin_operation("an offset reset")
        try:
            task = group.in_background(self._reset(group, order))
        except BaseException:
            group.end_operation()
            raise
        task.add_done_callback(lambda _task: group.end_operation())
        return await asyncio.shield(task)

    async def _reset(self, group: GroupRuntime, order: ResetOrder) -> ResetResult:
        if group.record.mode == "kafka_group":
            result = await self._reset_classic(group, order.spec)
        else:
            result = await self._reset_leased(group, order.spec)
        reset_id = uuid.uuid4().hex
        # An external reset's old offset is the holder's last commit: Kafka shows the new one.
        olds = {r.tp: order.previous.get(r.tp, r.old) for r in result.partitions}
        group.faults.offsets_reset(
            ResetAudit(
                reset_id=reset_id,
                actor=order.actor,
                source=order.source,
                strategy=order.spec.strategy.value,
                request_id=order.request_id,
                partitions=tuple(
                    (r.tp.topic, r.tp.partition, olds[r.tp], r.new, result.epochs.get(r.tp, 0))
                    for r in result.partitions
                ),
                detected_by=order.detected_by,
            )
        )
        log.info(
            "offsets reset",
            group=group.name,
            source=order.source,
            actor=order.actor,
            strategy=order.spec.strategy.value,
            partitions=len(result.partitions),
            offsets={
                f"{r.tp.topic}/{r.tp.partition}": [olds[r.tp], r.new] for r in result.partitions
            },
        )
        return result

    async def _reset_classic(self, group: GroupRuntime, spec: ResetSpec) -> ResetResult:
        members = await self.members.group_members(group.name)
        if members:
            raise not_empty(group.name, members)
        plan = await self._plan(group.name, spec)
        commits = {r.tp: (r.new, UNLEASED_EPOCH) for r in plan}
        await asyncio.to_thread(self.kafka.commit, group.name, commits)
        return ResetResult(plan, {}, applied=True)

    async def _reset_leased(self, group: GroupRuntime, spec: ResetSpec) -> ResetResult:
        coordinator = group.coordinator
        tps = sorted(spec.values)
        group.apply(coordinator.pause(tps, self.clock()))
        committed: dict[TopicPartition, int] | None = None
        try:
            await self._wait_paused(group, tps)
            plan = await self._plan(group.name, spec)
            epochs = coordinator.reset_epochs(tps)
            await group.persist_epochs(epochs)
            commits = {r.tp: (r.new, epochs[r.tp]) for r in plan}
            # fence_leases: a holder cut off from the assigner keeps committing under
            # commit_fencing: kafka (its lease has no deadline); initialising each lease's
            # transactional id first refuses its commits at Kafka from here on.
            await asyncio.to_thread(self.kafka.commit, group.name, commits, fence_leases=True)
            committed = {r.tp: r.new for r in plan}
        finally:
            if committed is None:
                # Nothing committed: granted again as after a handoff, at what Kafka has.
                group.apply(coordinator.unpause(tps, self.clock()))
            else:
                group.apply(coordinator.resume(committed, self.clock()))
        return ResetResult(plan, epochs, applied=True)

    async def _wait_paused(self, group: GroupRuntime, tps: Sequence[TopicPartition]) -> None:
        """Until every holder released (or its lease lapsed); bounded by the lease expiry."""
        limit = self.clock() + group.coordinator.timing.expiry + PAUSE_MARGIN_SECONDS
        while not group.coordinator.is_paused(tps):
            if self.clock() >= limit:
                held = sorted(
                    f"{tp.topic}/{tp.partition}"
                    for tp in tps
                    if group.coordinator.leases[tp].holder is not None
                )
                raise DsError(
                    Reason.SERVICE_NOT_READY,
                    f"group {group.name!r}: {', '.join(held)} not released in time; nothing "
                    "was reset, retry",
                    metadata={"group": group.name},
                )
            await asyncio.sleep(PAUSE_POLL_SECONDS)

    async def _plan(self, group: str, spec: ResetSpec) -> list[PartitionReset]:
        tps = sorted(spec.values)
        offsets = await asyncio.to_thread(self.kafka.read, group, tps)
        found: dict[TopicPartition, int] = {}
        if spec.strategy is Strategy.TIMESTAMP:
            found = await asyncio.to_thread(self.kafka.offsets_for_times, spec.values)
        return plan_resets(spec.strategy, spec.values, offsets, found)


def not_empty(group: str, members: int) -> DsError:
    return DsError(
        Reason.GROUP_NOT_EMPTY,
        f"group {group!r} is in kafka_group mode and its Kafka consumer group has {members} "
        "member(s): stop every consumer of the group first (kafka-consumer-groups "
        "--reset-offsets has the same rule)",
        metadata={"group": group, "members": str(members)},
    )
