"""The lag monitor forgets the commits of topics that no longer exist (issue 34).

``__consumer_offsets`` is read from its beginning, so it holds commits of topics deleted
long ago. Such a commit waits for its topic's first high watermark, which never comes: it
was kept waiting and applied again on every watermark poll (every 5 s, up to 100,000 of
them), which made the watermark poll most of an idle notifier's CPU on a broker where
tests create and delete topics."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

from services.notifier.lag_monitor import LagMonitor
from services.notifier.settings import LagSettings
from services.runtime import offsets_topic

LIVE, GONE = "orders", "deleted-long-ago"


class OneTopicAdmin:
    """An AdminClient of a cluster with one topic, LIVE, one partition ending at 10."""

    def __init__(self) -> None:
        self.asked: list[set[str]] = []

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={LIVE: SimpleNamespace(error=None, partitions={0: None})})

    def list_offsets(
        self, request: dict[TopicPartition, OffsetSpec], request_timeout: float
    ) -> dict[TopicPartition, Future[Any]]:
        self.asked.append({str(tp.topic) for tp in request})
        answers = {}
        for tp in request:
            future: Future[Any] = Future()
            future.set_result(SimpleNamespace(offset=10))
            answers[tp] = future
        return answers


def test_commits_of_a_deleted_topic_are_dropped_at_the_first_poll() -> None:
    admin = OneTopicAdmin()
    monitor = LagMonitor(
        LagSettings(),
        admin,  # type: ignore[arg-type]
        new_consumer=lambda: None,  # type: ignore[arg-type,return-value]
        wall_clock=lambda: 1_000.0,
    )
    with monitor._lock:
        for offset in range(3):
            monitor._apply(offsets_topic.OffsetCommit("g", GONE, 0, offset, 999_000 + offset))
        monitor._apply(offsets_topic.OffsetCommit("g", LIVE, 0, 5, 999_000))
    monitor.poll()
    assert monitor._waiting == []  # the deleted topic's commits are not kept for the next poll
    assert {topic for topic, _p in monitor._histories} == {LIVE}
    assert monitor.commits_seen == 1  # LIVE's commit, applied once its watermark is known
    monitor.poll()
    assert admin.asked[-1] == {LIVE}
    (group,) = monitor.evaluate()
    assert [p.topic for p in group.partitions] == [LIVE]
