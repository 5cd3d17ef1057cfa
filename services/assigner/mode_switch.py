"""Switching a group between ``leased`` and ``kafka_group`` with its sidecars attached and
its clients bound (ARCHITECTURE §5.6), keeping the committed offsets.

The two modes never run at once on one group id: Kafka accepts the commits of ``assign()``
consumers (leased sidecars) only while its group has no members (§10). So each direction
hands over in order:

* **to kafka_group**: the assigner stops granting and revokes every lease cooperatively
  (CONFIG: each holder drains in-flight acks, commits, releases; a holder that does not is
  waited out until its lease expires); once no partition has a holder, the new mode is
  stored and every sidecar's session is ended: each re-joins at once, learns the mode from
  its ``SessionAccepted`` and ``subscribe()``s. Kafka's group forms from an empty one and
  starts each partition at its committed offset.
* **to leased**: the new mode is stored (nothing is granted yet) and every session ended;
  each sidecar re-joins, hands its partitions back through Kafka's rebalance (drain,
  commit) and leaves Kafka's group. Once that group is empty, leases are granted, each at
  the committed offset.

Either way a record is delivered again only if it was delivered and not acked before its
partition changed hands. Clients stay bound: membership does not change, only the session
streams are renewed. The switch runs to its end once started (a call's deadline does not
stop it halfway): waiting for Kafka's group to empty may outlast the call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from dsclient.reasons import DsError, Reason
from services.assigner.groups import GroupRuntime
from services.assigner.kafka_cluster import GroupMembers
from services.assigner.state import GroupRecord

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.05
KAFKA_POLL_SECONDS = 0.5
# Beyond a holder's drain and its lease's expiry, how long to wait for the releases.
RELEASE_MARGIN_SECONDS = 2.0

Update = Callable[[GroupRecord], Awaitable[GroupRuntime]]


class ModeSwitch:
    def __init__(
        self,
        kafka: GroupMembers,
        *,
        drain_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self.drain_timeout = drain_timeout
        self.clock = clock

    async def switch(self, group: GroupRuntime, record: GroupRecord, update: Update) -> None:
        """Switch ``group`` to ``record.mode`` and store ``record`` with ``update`` (durable,
        then live); returns once the switch is complete (module docstring).
        OPERATION_IN_PROGRESS while another operation runs on the group."""
        group.begin_operation("a mode switch")
        try:
            if record.mode == "kafka_group":
                work = self._to_kafka_group(group, record, update)
            else:
                work = self._to_leased(group, record, update)
            task = group.in_background(work)
        except BaseException:
            group.end_operation()
            raise
        task.add_done_callback(lambda _task: group.end_operation())
        await asyncio.shield(task)

    async def _to_kafka_group(
        self, group: GroupRuntime, record: GroupRecord, update: Update
    ) -> None:
        coordinator = group.coordinator
        log.info("mode switch to kafka_group: revoking every lease", group=group.name)
        group.apply(coordinator.stop_granting(self.clock()))
        stored = False
        try:
            limit = self.clock() + self.drain_timeout + coordinator.timing.expiry
            while not coordinator.unheld():
                if self.clock() >= limit + RELEASE_MARGIN_SECONDS:
                    raise DsError(
                        Reason.SERVICE_NOT_READY,
                        f"group {group.name!r}: leases not released in time; the mode switch "
                        "was called off, retry",
                        metadata={"group": group.name},
                    )
                await asyncio.sleep(POLL_SECONDS)
            await update(record)
            stored = True
        finally:
            if not stored:
                group.apply(coordinator.start_granting(self.clock()))
        log.info("mode switch to kafka_group: every lease released; sidecars re-join")
        group.rejoin_all()

    async def _to_leased(self, group: GroupRuntime, record: GroupRecord, update: Update) -> None:
        coordinator = group.coordinator
        coordinator.grants_enabled = False  # until Kafka's group is empty
        await update(record)
        log.info("mode switch to leased: sidecars re-join, leave Kafka's group", group=group.name)
        group.rejoin_all()
        while True:
            try:
                members = await self.kafka.group_members(group.name)
            except DsError as err:
                log.warning("mode switch: cannot describe Kafka's group", error=err.message)
                members = -1
            if members == 0:
                break
            await asyncio.sleep(KAFKA_POLL_SECONDS)
        group.apply(coordinator.start_granting(self.clock()))
        log.info("mode switch to leased: Kafka's group is empty; leases granted", group=group.name)
