"""The sidecar's fault emitters (ARCHITECTURE §5.4): BROKER_UNREACHABLE and POISON_RECORD
from librdkafka's error callback and statistics, POISON_RECORD also for a record given up
after its delivery limit, COMMIT_FAILED from each commit round (and a revoke's final
commit), CLIENT_BACKPRESSURE from the fetch loop's paused partitions, OFFSET_GAP when a
partition's position fell outside its log.

Each hook turns what the sidecar saw into reports on the shared
:class:`~services.runtime.reporter.FaultReporter`; none of them raises (they run inside
librdkafka callbacks and the fetch loop).
"""

from __future__ import annotations

from collections.abc import Iterable

from dataservice.common.v1 import common_pb2
from services.consumer_sidecar.acks import GivenUp
from services.runtime.faults import OPEN, RESOLVED, dedupe_key
from services.runtime.reporter import FaultReporter, never_raises
from services.runtime.topic_partition import TP

# librdkafka error codes (KafkaError) that mean the brokers cannot be reached, and those
# that mean a record could not be read.
_UNREACHABLE_CODES = ("_ALL_BROKERS_DOWN", "_TRANSPORT", "_RESOLVE", "_AUTHENTICATION")
_POISON_CODES = ("_BAD_MSG", "_BAD_COMPRESSION", "CORRUPT_MESSAGE", "INVALID_RECORD")


class SidecarFaults:
    """The sidecar's fault hooks (Kafka errors, statistics, commits, backpressure)."""

    def __init__(self, reporter: FaultReporter | None, group: str, sidecar_id: str) -> None:
        self.reporter = reporter or FaultReporter.disabled("sidecar")
        self.group = group
        self.sidecar_id = sidecar_id
        self._paused: set[tuple[str, int]] = set()

    @never_raises
    def kafka_error(self, code_name: str, text: str) -> None:
        """An error callback of librdkafka (any thread)."""
        if code_name in _UNREACHABLE_CODES:
            self.reporter.track(
                "BROKER_UNREACHABLE",
                True,
                common_pb2.FAULT_TYPE_BROKER_UNREACHABLE,
                group=self.group,
                consumer_id=self.sidecar_id,
                message=f"Kafka unreachable: {text}",
                attributes={"error": code_name},
                dedupe_key=dedupe_key(
                    common_pb2.FAULT_TYPE_BROKER_UNREACHABLE, self.group, self.sidecar_id
                ),
            )
        elif code_name in _POISON_CODES:
            self.reporter.report(
                common_pb2.FAULT_TYPE_POISON_RECORD,
                OPEN,
                group=self.group,
                consumer_id=self.sidecar_id,
                message=f"record not readable: {text}",
                attributes={"error": code_name},
            )

    @never_raises
    def given_up(self, tp: TP, epoch: int, given_up: GivenUp) -> None:
        """Records delivered ``max_deliveries`` times without an ack, given up when they
        came due again: POISON_RECORD naming the partition and the offsets."""
        last = given_up.hi - 1
        where = f"{tp.topic}[{tp.partition}]@{given_up.lo}" + (
            f"..{last}" if last > given_up.lo else ""
        )
        self.reporter.report(
            common_pb2.FAULT_TYPE_POISON_RECORD,
            OPEN,
            group=self.group,
            consumer_id=self.sidecar_id,
            topic=tp.topic,
            partitions=[tp.partition],
            message=(
                f"{where} delivered {given_up.deliveries} times without an ack: given up "
                "(not delivered again; the commit point passes it)"
            ),
            attributes={
                "offset": str(given_up.lo),
                "last_offset": str(last),
                "deliveries": str(given_up.deliveries),
                "lease_epoch": str(epoch),
                "reason": "max_deliveries",
            },
        )

    @never_raises
    def offset_gap(self, tp: TP, lo: int, hi: int, reason: str) -> None:
        """A partition's position fell outside its log: offsets [lo, hi) were skipped
        (retention, a reset) or vanished (a truncated log). OPEN, and RESOLVED at once:
        fetching goes on from the new position."""
        if reason == "truncated":
            message = (
                f"{tp.topic}[{tp.partition}] log truncated below the position: offsets "
                f"{lo}..{hi - 1} no longer exist; fetching goes on from {lo}"
            )
        else:
            message = (
                f"{tp.topic}[{tp.partition}] offsets {lo}..{hi - 1} skipped: the position "
                f"{lo} was outside the log ({reason}); fetching goes on from {hi}"
            )
        key = dedupe_key(
            common_pb2.FAULT_TYPE_OFFSET_GAP,
            self.group,
            self.sidecar_id,
            tp.topic,
            str(tp.partition),
        )
        for state in (OPEN, RESOLVED):
            self.reporter.report(
                common_pb2.FAULT_TYPE_OFFSET_GAP,
                state,
                group=self.group,
                consumer_id=self.sidecar_id,
                topic=tp.topic,
                partitions=[tp.partition],
                message=message,
                attributes={
                    "from_offset": str(lo),
                    "to_offset": str(hi),
                    "skipped": str(hi - lo) if reason != "truncated" else "0",
                    "reason": reason,
                },
                dedupe_key=key,
            )

    @never_raises
    def brokers_up(self, statistics: str) -> None:
        """librdkafka statistics (JSON): a broker in state UP resolves BROKER_UNREACHABLE."""
        if self.reporter.is_open("BROKER_UNREACHABLE") and '"state":"UP"' in statistics:
            self.reporter.track(
                "BROKER_UNREACHABLE",
                False,
                common_pb2.FAULT_TYPE_BROKER_UNREACHABLE,
                message="Kafka reachable again",
            )

    @never_raises
    def commit(self, error: BaseException | None) -> None:
        """The outcome of a commit round: every failure is reported (the notifier
        suppresses the storm and counts it); the first success after one resolves it."""
        key = dedupe_key(common_pb2.FAULT_TYPE_COMMIT_FAILED, self.group, self.sidecar_id)
        if error is not None:
            self.reporter.track(
                "COMMIT_FAILED",
                True,
                common_pb2.FAULT_TYPE_COMMIT_FAILED,
                repeat=True,
                group=self.group,
                consumer_id=self.sidecar_id,
                message=f"commit failed: {error}",
                attributes={"error": type(error).__name__},
                dedupe_key=key,
            )
        elif self.reporter.is_open("COMMIT_FAILED"):
            self.reporter.track(
                "COMMIT_FAILED",
                False,
                common_pb2.FAULT_TYPE_COMMIT_FAILED,
                message="commits succeed again",
            )

    @never_raises
    def backpressure(self, paused: Iterable[tuple[str, int]]) -> None:
        """The partitions paused on a full buffer right now (topic, partition)."""
        now = set(paused)
        for topic, partition in sorted(now ^ self._paused):
            active = (topic, partition) in now
            self.reporter.track(
                ("CLIENT_BACKPRESSURE", topic, partition),
                active,
                common_pb2.FAULT_TYPE_CLIENT_BACKPRESSURE,
                group=self.group,
                consumer_id=self.sidecar_id,
                topic=topic,
                partitions=[partition],
                message=(
                    f"{topic}[{partition}] paused: clients do not keep up (buffer full)"
                    if active
                    else f"{topic}[{partition}] resumed"
                ),
            )
        self._paused = now
