"""``dsctl lag`` (the assigner's ``offsets.lag_records``) and ``ds_group_lag_records`` (the
notifier's lag monitor) give one figure for one partition, also after retention deleted
records the group had not consumed: lag counts records still in the log, from the log start
when the committed offset points below it."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from services.assigner.offsets import PartitionOffsets
from services.notifier.lag_monitor import LagMonitor
from services.notifier.settings import LagSettings
from services.runtime import offsets_topic

TOPIC, PARTITION = "orders", 0
COMMITTED, LOG_START, END = 100, 500, 1000  # retention deleted offsets 100..499 unconsumed


class RetainedLogAdmin:
    """An AdminClient whose one partition's log starts at LOG_START and ends at END."""

    def list_topics(self, timeout: float) -> Any:
        topic = SimpleNamespace(error=None, partitions={PARTITION: object()})
        return SimpleNamespace(topics={TOPIC: topic})

    def list_offsets(
        self, request: dict[TopicPartition, OffsetSpec], request_timeout: float
    ) -> dict[TopicPartition, Future[Any]]:
        answers = {}
        for tp, spec in request.items():
            future: Future[Any] = Future()
            offset = LOG_START if spec == OffsetSpec.earliest() else END  # type: ignore[no-untyped-call]
            future.set_result(SimpleNamespace(offset=offset))
            answers[tp] = future
        return answers


def monitor_lag() -> int:
    monitor = LagMonitor(
        LagSettings(),
        RetainedLogAdmin(),  # type: ignore[arg-type]
        new_consumer=lambda: None,  # type: ignore[arg-type,return-value]
        wall_clock=lambda: 1_000.0,
    )
    commit = offsets_topic.OffsetCommit("g", TOPIC, PARTITION, COMMITTED, 999_000)
    with monitor._lock:
        monitor._apply(commit)  # waits for the topic's first high watermark
    monitor.poll()
    (group,) = monitor.evaluate()
    (partition,) = group.partitions
    return partition.lag_records


def test_dsctl_lag_and_the_lag_metric_agree_after_retention() -> None:
    dsctl = PartitionOffsets(COMMITTED, LOG_START, END).lag
    assert dsctl == END - LOG_START
    assert monitor_lag() == dsctl
