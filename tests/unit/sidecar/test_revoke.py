"""The revoke path of the lease keeper when Kafka refuses the final commit.

A real LeaseKeeper over a real PartitionTable; Kafka is replaced at the fetcher's edge
(``stream_harness.FakeFetcher``): its commits fail while the partition is revoked.
"""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import KafkaError, KafkaException

from services.consumer_sidecar.events import LeaseCommitEvents, LeaseEvents
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import TOPIC, Sidecar


def test_a_failed_final_commit_still_releases_the_partition_and_reports_the_fault() -> None:
    """Kafka refuses the revoke's final commit: the keeper reports COMMIT_FAILED, retries
    while its lease lasts, then releases the partition with the offset that *is* committed
    (the next owner resumes there: acked records after it come again, nothing is lost) and
    hands it back to Kafka, instead of leaving it revoking forever."""

    async def main() -> None:
        faults: list[BaseException | None] = []
        sc = Sidecar(LeaseEvents(commits=LeaseCommitEvents(on_commit=faults.append)))
        tp = TP(TOPIC, 0)
        part = sc.hold(0, epoch=3, start=10, ttl=1.0)
        sc.buffer(0, range(10, 15))
        taken = sc.table.take(5, 1 << 20)
        assert sum(map(len, taken)) == 5
        sc.table.ack_range(part, 10, 15)
        sc.fetcher.fail = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        started = time.monotonic()
        await asyncio.wait_for(sc.keeper.revoke(tp, 3, drain_timeout=0.2), 10)
        released = sc.keeper.take_released()
        assert [(r.tp, r.epoch, r.committed) for r in released] == [(tp, 3, 10)]
        assert sc.table.get(tp) is None, "the partition is given up"
        assert sc.fetcher.unassigned == [tp], "and handed back to Kafka"
        assert faults and all(isinstance(f, KafkaException) for f in faults)
        assert time.monotonic() - started <= 1.5, "within the lease"

    asyncio.run(main())


def test_a_final_commit_that_succeeds_on_a_retry_releases_at_the_acked_offset() -> None:
    async def main() -> None:
        outcomes: list[BaseException | None] = []
        sc = Sidecar(LeaseEvents(commits=LeaseCommitEvents(on_commit=outcomes.append)))
        tp = TP(TOPIC, 0)
        part = sc.hold(0, epoch=3, start=10, ttl=5.0)
        sc.buffer(0, range(10, 15))
        sc.table.take(5, 1 << 20)
        sc.table.ack_range(part, 10, 15)
        sc.fetcher.fail = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

        async def kafka_back() -> None:
            await asyncio.sleep(0.3)
            sc.fetcher.fail = None

        back = asyncio.ensure_future(kafka_back())
        await asyncio.wait_for(sc.keeper.revoke(tp, 3, drain_timeout=0.2), 10)
        await back
        released = sc.keeper.take_released()
        assert [(r.tp, r.epoch, r.committed) for r in released] == [(tp, 3, 15)]
        assert [c.offset for c in sc.fetcher.commits] == [15]
        assert outcomes[-1] is None, "the fault resolves with the successful commit"

    asyncio.run(main())
