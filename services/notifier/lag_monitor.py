"""The lag evaluator's I/O: commits from ``__consumer_offsets``, high watermarks from the
AdminClient, both in the background (never at scrape time); evaluation in :mod:`lag`.

* A reader thread consumes every partition of ``__consumer_offsets`` from the beginning
  (as Burrow does: the compacted log still holds each group's last commit with its time)
  and feeds each offset commit into its partition's :class:`lag.CommitWindow`. Every group
  is seen this way, leased (the sidecars commit with ``assign()``) or ``kafka_group``.
* Every ``poll_seconds`` one metadata request and two batched ``list_offsets`` (latest and
  earliest) for every partition of every topic some group commits to give the high
  watermarks, appended to each partition's :class:`lag.WatermarkHistory`, and the log start
  offsets, from which lag is counted when retention deleted records not yet consumed.
* Every ``evaluate_seconds`` each group is evaluated; the result goes to the metrics and
  through :class:`lag.LagFaultTracker` to LAG_* fault events (:func:`fault_event`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dataservice.common.v1 import common_pb2
from services.notifier.settings import LagSettings
from services.runtime import lag, offsets_topic
from services.runtime.faults import CATALOGUE, dedupe_key

log = structlog.get_logger(__name__)

# Commits of topics whose high watermark is not known yet wait for the next poll.
MAX_WAITING_COMMITS = 100_000


@dataclass(frozen=True)
class _Key:
    group: str
    topic: str
    partition: int


class LagMonitor:
    def __init__(
        self,
        settings: LagSettings,
        admin: AdminClient,
        new_consumer: Callable[[], Consumer],
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._admin = admin
        self._new_consumer = new_consumer
        self._clock = wall_clock
        self._lock = threading.Lock()
        self._windows: dict[_Key, lag.CommitWindow] = {}
        self._last_commit_ms: dict[str, int] = {}
        self._histories: dict[tuple[str, int], lag.WatermarkHistory] = {}
        self._waiting: list[offsets_topic.OffsetCommit] = []
        self._positions: dict[int, int] = {}  # __consumer_offsets partition -> next offset
        self._include = re.compile(settings.group_include)
        self._exclude = re.compile(settings.group_exclude)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="offsets-reader", daemon=True)
        self.tracker = lag.LagFaultTracker()
        self.commits_seen = 0

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self._reader.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reader.is_alive():
            self._reader.join(10)

    # ---- commits (reader thread) ----------------------------------------------------------

    def _wanted(self, group: str) -> bool:
        return bool(self._include.search(group)) and not self._exclude.search(group)

    def _read(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            consumer: Consumer | None = None
            try:
                consumer = self._new_consumer()
                partitions = self._offsets_partitions(consumer)
                if not partitions:
                    # No group ever committed on a fresh cluster: the topic does not exist.
                    self._stop.wait(min(backoff, self.settings.poll_seconds))
                    backoff = min(backoff * 2, 10.0)
                    continue
                # From the beginning the first time; after a failure, from where it was,
                # so no commit enters a window twice (that would look like a rewind).
                consumer.assign(
                    [
                        TopicPartition(
                            offsets_topic.OFFSETS_TOPIC, p, self._positions.get(p, OFFSET_BEGINNING)
                        )
                        for p in partitions
                    ]
                )
                backoff = 0.5
                while not self._stop.is_set():
                    for msg in consumer.consume(1000, 0.5):
                        if msg.error() is None:
                            self._on_record(msg.key(), msg.value())
                            self._positions[int(msg.partition() or 0)] = int(msg.offset() or 0) + 1
            except Exception as exc:
                log.warning("offsets reader failed; restarting", error=repr(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                if consumer is not None:
                    consumer.close()

    @staticmethod
    def _offsets_partitions(consumer: Consumer) -> list[int]:
        metadata = consumer.list_topics(offsets_topic.OFFSETS_TOPIC, timeout=10)
        info = metadata.topics.get(offsets_topic.OFFSETS_TOPIC)
        if info is None or info.error is not None:
            if info is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return []
            raise KafkaException(info.error if info is not None else "no metadata")
        return sorted(info.partitions)

    def _on_record(self, key: object, value: object) -> None:
        try:
            commit = offsets_topic.decode(
                key if isinstance(key, bytes) else None,
                value if isinstance(value, bytes) else None,
            )
        except ValueError as exc:
            log.warning("undecodable offset commit record", error=str(exc))
            return
        if commit is None or not self._wanted(commit.group):
            return
        with self._lock:
            self._apply(commit)

    def _apply(self, commit: offsets_topic.OffsetCommit) -> None:
        key = _Key(commit.group, commit.topic, commit.partition)
        if commit.offset is None:
            self._windows.pop(key, None)  # offsets deleted (DeleteGroups / expiry)
            return
        history = self._histories.get((commit.topic, commit.partition))
        if history is None or history.latest is None:
            # Burrow drops these; we keep them until the next poll knows the topic.
            if len(self._waiting) < MAX_WAITING_COMMITS:
                self._waiting.append(commit)
            self._histories.setdefault(
                (commit.topic, commit.partition),
                lag.WatermarkHistory(self.settings.history_points, self.settings.intervals),
            )
            return
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = lag.CommitWindow(
                self.settings.intervals, int(self.settings.min_distance_seconds * 1000)
            )
        window.add(commit.offset, commit.commit_timestamp_ms, history.latest)
        previous = self._last_commit_ms.get(commit.group, 0)
        self._last_commit_ms[commit.group] = max(previous, commit.commit_timestamp_ms)
        self.commits_seen += 1

    # ---- high watermarks (called in a worker thread) ---------------------------------------

    def poll(self) -> None:
        """One batched read of the high watermark and the log start offset of every
        partition groups commit to."""
        with self._lock:
            topics = {topic for topic, _p in self._histories}
        if not topics:
            return
        metadata = self._admin.list_topics(timeout=10)
        # Topics some commit named that the cluster no longer has (the log is read from its
        # beginning): their commits would wait for a watermark for good, applied again on
        # every poll (issue 34: most of an idle notifier's CPU). Forgotten instead.
        gone = topics - set(metadata.topics)
        if gone:
            self._forget(gone)
        partitions: list[TopicPartition] = []
        for topic in sorted(topics):
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                continue
            partitions += [TopicPartition(topic, partition) for partition in info.partitions]
        if not partitions:
            return
        ends = self._list_offsets(partitions, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        now = self._clock()
        starts = self._list_offsets(partitions, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        with self._lock:
            for key, offset in ends.items():
                history = self._histories.get(key)
                if history is None:
                    history = self._histories[key] = lag.WatermarkHistory(
                        self.settings.history_points, self.settings.intervals
                    )
                history.add(now, offset)
                history.log_start = starts.get(key, history.log_start)
            waiting, self._waiting = self._waiting, []
            for commit in waiting:
                self._apply(commit)

    def _forget(self, topics: set[str]) -> None:
        with self._lock:
            for key in [k for k in self._histories if k[0] in topics]:
                del self._histories[key]
            self._waiting = [c for c in self._waiting if c.topic not in topics]

    def _list_offsets(
        self, partitions: list[TopicPartition], spec: OffsetSpec
    ) -> dict[tuple[str, int], int]:
        futures = self._admin.list_offsets({tp: spec for tp in partitions}, request_timeout=10)
        return {
            (str(tp.topic), int(tp.partition)): int(future.result(timeout=15).offset)
            for tp, future in futures.items()
        }

    # ---- evaluation ---------------------------------------------------------------------

    def evaluate(self) -> list[lag.GroupLag]:
        now = self._clock()
        expire_before = int((now - self.settings.expire_group_seconds) * 1000)
        by_group: dict[str, list[lag.PartitionLag]] = {}
        with self._lock:
            for group, last in list(self._last_commit_ms.items()):
                if last < expire_before:
                    del self._last_commit_ms[group]
                    for key in [k for k in self._windows if k.group == group]:
                        del self._windows[key]
            for key, window in self._windows.items():
                history = self._histories.get((key.topic, key.partition))
                if history is None:
                    continue
                result = lag.evaluate_partition(
                    key.topic, key.partition, window, history, now, self.settings.min_complete
                )
                if result is not None:
                    by_group.setdefault(key.group, []).append(result)
        return [
            lag.GroupLag(
                group,
                lag.group_status(p.status for p in parts),
                tuple(sorted(parts, key=lambda p: (p.topic, p.partition))),
            )
            for group, parts in sorted(by_group.items())
        ]

    def thresholds(self, group: str) -> lag.Thresholds:
        chosen = self.settings.thresholds.get(group) or self.settings.thresholds.get("*")
        if chosen is None:
            return lag.Thresholds()
        return lag.Thresholds(
            warn_records=chosen.warn_records,
            error_records=chosen.error_records,
            warn_seconds=chosen.warn_seconds,
            error_seconds=chosen.error_seconds,
        )

    def transitions(self, groups: list[lag.GroupLag]) -> list[lag.Transition]:
        out: list[lag.Transition] = []
        seen = set()
        for group in groups:
            seen.add(group.group)
            found = lag.conditions(group, self.thresholds(group.group))
            out.extend(self.tracker.update(group.group, found))
        for group_name in {g for g, _t in self.tracker.open} - seen:
            out.extend(self.tracker.forget(group_name))
        return out


def fault_event(transition: lag.Transition, instance: str) -> common_pb2.FaultEvent:
    """The LAG_* event (OPEN or RESOLVED) of a tracker transition, reported by ``instance``."""
    spec = CATALOGUE[transition.type]
    parts = transition.condition.partitions
    topics = transition.condition.topics
    worst_records = max((p.lag_records for p in parts), default=0)
    worst_seconds = max((p.lag_seconds for p in parts), default=0.0)
    opened = transition.state == common_pb2.FAULT_STATE_OPEN
    event = common_pb2.FaultEvent(
        type=transition.type,
        state=transition.state,
        severity=spec.severity,
        source_service="notifier",
        source_instance=instance,
        group=transition.group,
        topic=topics[0] if len(topics) == 1 else "",
        partitions=sorted({p.partition for p in parts}) if len(topics) == 1 else [],
        message=(
            f"group {transition.group}: {spec.name} on {len(parts)} partition(s), "
            f"lag {worst_records} records / {worst_seconds:.1f} s"
            if opened
            else f"group {transition.group}: {spec.name} resolved"
        ),
        dedupe_key=dedupe_key(transition.type, transition.group),
    )
    event.attributes.update(
        {
            "lag": str(worst_records),
            "lag_seconds": f"{worst_seconds:.1f}",
            "status": ",".join(sorted({p.status.name for p in parts})),
            "topics": ",".join(topics),
            "partitions": ",".join(f"{p.topic}:{p.partition}" for p in parts[:50]),
        }
    )
    return event
