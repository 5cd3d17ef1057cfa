"""Offset resets made outside the mesh, followed (issue 23).

In leased mode Kafka's group has no members (the sidecars ``assign()``), so
``kafka-consumer-groups --reset-offsets`` accepts a reset while the sidecars consume. The
holder of each partition notices the commit it did not make
(:func:`services.runtime.commitmeta.is_external`), stops committing the partition and
reports it in every heartbeat; this module turns those reports into an offset reset of the
one path every reset takes (:class:`~services.assigner.resets.OffsetResets`, source
``external``): pause, the holder drops what it buffered or has in flight, a new epoch, the
externally committed offset committed under it (an ABSOLUTE reset to it), and the grant
back to the same holder there. A report counts only from the partition's current holder
under its current epoch with the lease granted, so one reset follows each external commit:
reports sent before the reset ended carry the old epoch. And a report is the holder's word:
the reset follows it only when Kafka holds the reported offset when the reset starts (a
sidecar credential must not move offsets; issue 37, finding 3).

The holders' check has a window Kafka cannot close (no compare-and-set on offsets): an
external commit landing between a holder's OffsetFetch and its OffsetCommit is overwritten
unseen. The log of commits (:mod:`~services.assigner.commit_log`) still has it:
:meth:`ExternalResets.observe` follows an external commit that no reset through the
assigner followed within ``log_grace_seconds`` (the holder's report normally did, within
a heartbeat), from the partition's current holder under its current epoch.

Reports of one group are gathered for a moment (several holders notice the same
``--reset-offsets --execute`` within one check interval) and reset together; while
another operation runs on the group they wait for it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from dataservice.assigner.v1 import assigner_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.admin.reset_request import ResetSpec
from services.assigner.commit_log import READ_DELAY_SECONDS
from services.assigner.coordinator import LeaseState
from services.assigner.fault_emitters import ResetAudit
from services.assigner.groups import GroupRuntime
from services.assigner.kafka_reset import COMMITTER_ID
from services.assigner.reset_targets import Strategy
from services.assigner.resets import OffsetResets, ResetOrder
from services.runtime import commitmeta
from services.runtime.offsets_topic import OffsetCommit
from services.runtime.topic_partition import TopicPartition

log = structlog.get_logger(__name__)

GATHER_SECONDS = 0.1
RETRY_SECONDS = 0.2
LOG_GRACE_SECONDS = 0.3
COMMIT_LOG = "commit log"  # ExternalReport.found_by: the assigner's own reading of the log


@dataclass(frozen=True)
class ExternalReport:
    holder: str
    epoch: int
    previous: int  # the holder's last commit
    offset: int  # the external commit
    metadata: str
    found_by: str = ""  # the holder, or the commit log


class ExternalResets:
    def __init__(
        self,
        resets: OffsetResets,
        lookup: Callable[[str], GroupRuntime | None],
        *,
        gather_seconds: float = GATHER_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        log_grace_seconds: float = LOG_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resets = resets
        self.lookup = lookup
        self.gather_seconds = gather_seconds
        self.retry_seconds = retry_seconds
        self.log_grace_seconds = log_grace_seconds
        self.clock = clock
        self._pending: dict[str, dict[TopicPartition, ExternalReport]] = {}
        self._running: set[str] = set()
        # From the commit log: external commits not followed yet, (offset, metadata, seen at).
        self._logged: dict[tuple[str, TopicPartition], tuple[int, str, float]] = {}
        # The last external offset each partition was reset to, and when the reset ended.
        self._followed: dict[tuple[str, TopicPartition], tuple[int, float]] = {}

    def observe(self, commit: OffsetCommit) -> None:
        """A commit of ``__consumer_offsets`` (module docstring)."""
        group = self.lookup(commit.group)
        if (
            group is None
            or group.record.mode == "kafka_group"
            or group.record.external_offset_changes == "ignore"
            or commit.offset is None
        ):
            return
        key = (group.name, TopicPartition(commit.topic, commit.partition))
        meta = commitmeta.decode(commit.metadata, commit.offset)
        if meta is None or not meta.sidecar:
            entry = (commit.offset, commit.metadata, self.clock())
            self._logged[key] = entry
            # Revert mode: the holder's own report of its revert normally comes first.
            grace = self.log_grace_seconds * (3 if _reverts(group) else 1)
            asyncio.get_running_loop().call_later(grace, self._check_logged, key, entry)
        elif meta.sidecar == COMMITTER_ID:
            self._logged.pop(key, None)  # a reset through the assigner came after it

    def _check_logged(self, key: tuple[str, TopicPartition], entry: tuple[int, str, float]) -> None:
        if self._logged.get(key) != entry:
            return  # followed, or a later external commit checked on its own
        offset, metadata, seen = entry
        followed = self._followed.get(key)
        group = self.lookup(key[0])
        # The log is read in batches (commit_log.READ_DELAY_SECONDS, issue 34): a holder's
        # follow, or its revert, reported at once, often ends before the log shows the
        # commit it followed. A follow to the same offset that recent is that commit's.
        reverts = group is not None and _reverts(group)
        since = seen - max(READ_DELAY_SECONDS, self.log_grace_seconds * 3 if reverts else 0.0)
        if group is None or (
            followed is not None and followed[0] == offset and followed[1] >= since
        ):
            del self._logged[key]
            return
        tp = key[1]
        lease = group.coordinator.leases.get(tp)
        if lease is None or lease.holder is None:
            del self._logged[key]  # unheld: the next holder starts there or finds it
            return
        if lease.state is not LeaseState.GRANTED or tp in group.coordinator.paused:
            loop = asyncio.get_running_loop()
            loop.call_later(self.log_grace_seconds, self._check_logged, key, entry)
            return
        if _reverts(group):
            # Overwritten by the holder's own commit: reverted, as the group asks.
            self._audit_reverted(
                group, "commit log", {tp: (lease.epoch, lease.committed, offset, metadata)}
            )
            del self._logged[key]
            return
        log.warning(
            "external commit found in the commit log, overwritten before a holder saw it",
            group=group.name, topic=tp.topic, partition=tp.partition, offset=offset,
            holder=lease.holder,
        )  # fmt: skip
        found = ExternalReport(
            lease.holder, lease.epoch, lease.committed, offset, metadata, COMMIT_LOG
        )
        self._queue(group, {tp: found})

    def report(
        self, group: GroupRuntime, member: str, commits: Iterable[assigner_pb2.ExternalCommit]
    ) -> None:
        """A heartbeat's external commits: queue those of current leases, start following."""
        pending = self._pending.setdefault(group.name, {})
        reverted: dict[TopicPartition, tuple[int, int, int, str]] = {}
        for commit in commits:
            tp = TopicPartition(commit.topic, commit.partition)
            if commit.reverted:
                reverted[tp] = (
                    commit.epoch, commit.previous_offset, commit.committed_offset, commit.metadata
                )  # fmt: skip
                self._followed[(group.name, tp)] = (commit.committed_offset, self.clock())
                continue
            found = ExternalReport(
                member, commit.epoch, commit.previous_offset, commit.committed_offset,
                commit.metadata,
            )  # fmt: skip
            if _current(group, tp, found):
                pending.setdefault(tp, found)
        if reverted:
            self._audit_reverted(group, member, reverted)
        self._queue(group, {})

    def _audit_reverted(
        self,
        group: GroupRuntime,
        detected_by: str,
        reverted: dict[TopicPartition, tuple[int, int, int, str]],
    ) -> None:
        """Revert mode: OFFSETS_RESET with source external and action reverted, each
        partition's offsets from the external commit back to the mesh's position."""
        writers = sorted({commitmeta.describe_writer(m) for *_, m in reverted.values()})
        log.warning(
            "external offset change reverted",
            group=group.name,
            detected_by=detected_by,
            offsets={
                f"{tp.topic}/{tp.partition}": [external, restored]
                for tp, (_, restored, external, _) in reverted.items()
            },
        )
        group.faults.offsets_reset(
            ResetAudit(
                reset_id=uuid.uuid4().hex,
                actor="; ".join(writers),
                source="external",
                strategy="revert",
                request_id="",
                partitions=tuple(
                    (tp.topic, tp.partition, external, restored, epoch)
                    for tp, (epoch, restored, external, _) in sorted(reverted.items())
                ),
                detected_by=detected_by,
                action="reverted",
            )
        )

    def _queue(self, group: GroupRuntime, reports: dict[TopicPartition, ExternalReport]) -> None:
        pending = self._pending.setdefault(group.name, {})
        for tp, found in reports.items():
            pending.setdefault(tp, found)
        if pending and group.name not in self._running:
            self._running.add(group.name)
            group.in_background(self._follow(group))

    async def _follow(self, group: GroupRuntime) -> None:
        try:
            while self._pending.get(group.name):
                await asyncio.sleep(self.gather_seconds)
                reports = {
                    tp: r
                    for tp, r in self._pending.pop(group.name, {}).items()
                    if _current(group, tp, r)
                }
                if reports and not await self._reset(group, reports):
                    for tp, r in reports.items():
                        self._pending.setdefault(group.name, {}).setdefault(tp, r)
                    await asyncio.sleep(self.retry_seconds)
        finally:
            self._running.discard(group.name)

    async def _shown_by_kafka(
        self, group: GroupRuntime, reports: dict[TopicPartition, ExternalReport]
    ) -> dict[TopicPartition, ExternalReport]:
        """The reports whose offset Kafka holds now. A holder's report is its word, and a
        reset moves offsets, which only an admin may ask for (issue 37, finding 3): one
        Kafka does not show is dropped. The commit log's own finds are the assigner's
        reading of ``__consumer_offsets`` (already overwritten in Kafka), kept as found."""
        told = sorted(tp for tp, r in reports.items() if r.found_by != COMMIT_LOG)
        if not told:
            return reports
        try:
            held = await asyncio.to_thread(self.resets.kafka.read, group.name, told)
        except DsError as exc:
            log.warning("cannot check reported external commits", group=group.name, error=str(exc))
            return {tp: r for tp, r in reports.items() if r.found_by == COMMIT_LOG}
        shown = {}
        for tp, r in reports.items():
            kafka = held[tp].committed if tp in held else None
            if r.found_by == COMMIT_LOG or kafka == r.offset:
                shown[tp] = r
                continue
            log.warning(
                "reported external commit not in Kafka: ignored",
                group=group.name, topic=tp.topic, partition=tp.partition, reported=r.offset,
                kafka=kafka, holder=r.holder,
            )  # fmt: skip
        return shown

    async def _reset(
        self, group: GroupRuntime, reports: dict[TopicPartition, ExternalReport]
    ) -> bool:
        """One reset to the external offsets; False to retry (another operation runs)."""
        reports = await self._shown_by_kafka(group, reports)
        if not reports:
            return True
        writers = sorted({commitmeta.describe_writer(r.metadata) for r in reports.values()})
        order = ResetOrder(
            ResetSpec(Strategy.ABSOLUTE, {tp: r.offset for tp, r in reports.items()}),
            source="external",
            actor="; ".join(writers),
            previous={tp: r.previous for tp, r in reports.items()},
            detected_by=",".join(sorted({r.found_by or r.holder for r in reports.values()})),
        )
        try:
            await self.resets.reset(group, order)
            ended = self.clock()
            for tp, r in reports.items():
                self._followed[(group.name, tp)] = (r.offset, ended)
        except DsError as exc:
            if exc.reason == Reason.OPERATION_IN_PROGRESS:
                return False
            # The partitions were granted back at what Kafka has; a holder still seeing a
            # commit it did not make reports it again under its new epoch.
            log.warning("following an external reset failed", group=group.name, error=str(exc))
        return True


def _current(group: GroupRuntime, tp: TopicPartition, report: ExternalReport) -> bool:
    lease = group.coordinator.leases.get(tp)
    return (
        lease is not None
        and lease.holder == report.holder
        and lease.epoch == report.epoch
        and lease.state is LeaseState.GRANTED
        and tp not in group.coordinator.paused
    )


def _reverts(group: GroupRuntime) -> bool:
    return group.record.external_offset_changes == "revert"
