"""The commits of the served groups as Kafka logged them, read from ``__consumer_offsets``
(issue 23): the safety net of following external resets.

A holder notices a commit it did not make with an OffsetFetch right before each of its
commits and on an interval, but Kafka has no compare-and-set on offsets: an external
commit that lands between a holder's OffsetFetch and its OffsetCommit is overwritten before
anyone read it. The log keeps it: every commit is a record of ``__consumer_offsets``, in
order, with its metadata. The leader reads the log from its end and hands each commit of a
group it serves to :meth:`ExternalResets.observe
<services.assigner.external_resets.ExternalResets.observe>`, which follows an external
commit that no reset through the assigner followed soon after.

The blocking consumer runs on one worker thread of its own (consume, then close, never at
the same time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from services.runtime import offsets_topic
from services.runtime.kafka import new_consumer
from services.runtime.settings import ServiceSettings

log = structlog.get_logger(__name__)

# The log is how the mesh follows an external commit under a steady ack stream (a holder
# reads its committed offsets back at most once per interval), so it is read promptly: the
# broker holds each fetch up to FETCH_WAIT_MS (it answered every commit at once before,
# ~340 wake-ups/s of the reader's broker thread on the shared broker, the mesh idle; issue
# 34). A read waits for the first record up to IDLE_POLL_SECONDS, returning the moment one
# comes, then takes what else is there (up to BATCH) without waiting: an idle log costs a
# wake-up a second. (It was consume(BATCH, 0.1): a return every 0.1 s, and librdkafka's
# batch wait woke its thread ~46 times a second, a third of an idle assigner's CPU.)
FETCH_WAIT_MS = 100
IDLE_POLL_SECONDS = 1.0
# How long after Kafka wrote a commit the log may show it: the fetch's wait, and a margin
# for handing the batch to the event loop.
READ_DELAY_SECONDS = FETCH_WAIT_MS / 1000 + 0.1
BATCH = 1000


class CommitLog:
    def __init__(
        self,
        settings: ServiceSettings,
        wanted: Callable[[str], bool],
        on_commit: Callable[[offsets_topic.OffsetCommit], None],
    ) -> None:
        self.settings = settings
        self.wanted = wanted
        self.on_commit = on_commit

    async def run(self) -> None:
        """Until cancelled: read the log from its end, restarting after a failure."""
        backoff = 0.5
        while True:
            worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit-log")
            loop = asyncio.get_running_loop()
            consumer: Consumer | None = None
            try:
                consumer = await loop.run_in_executor(worker, self._open)
                if consumer is None:  # no group ever committed: the topic does not exist
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                backoff = 0.5
                while True:
                    batch = await loop.run_in_executor(worker, self._read, consumer)
                    for commit in batch:
                        self.on_commit(commit)
            except (KafkaException, ValueError) as exc:
                log.warning("commit log reader failed; restarting", error=repr(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                if consumer is not None:
                    worker.submit(consumer.close)
                worker.shutdown(wait=False)

    def _open(self) -> Consumer | None:
        consumer = new_consumer(
            self.settings,
            group="ds-assigner-commit-log",
            client_id="ds-assigner-commit-log",
            overrides=offsets_topic.reader_overrides(FETCH_WAIT_MS),
        )
        metadata = consumer.list_topics(offsets_topic.OFFSETS_TOPIC, timeout=10)
        info = metadata.topics.get(offsets_topic.OFFSETS_TOPIC)
        if info is None or info.error is not None:
            consumer.close()
            if info is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise KafkaException(info.error if info is not None else "no metadata")
        consumer.assign(
            [TopicPartition(offsets_topic.OFFSETS_TOPIC, p, OFFSET_END) for p in info.partitions]
        )
        return consumer

    def _read(self, consumer: Consumer) -> list[offsets_topic.OffsetCommit]:
        first = consumer.poll(IDLE_POLL_SECONDS)
        if first is None:
            return []
        out = []
        for msg in [first, *consumer.consume(BATCH - 1, 0)]:
            if msg.error() is not None:
                continue
            commit = offsets_topic.decode(msg.key(), msg.value())
            if commit is not None and commit.offset is not None and self.wanted(commit.group):
                out.append(commit)
        return out
