"""Leases that outlive the assigner's absence (issue 36, ``commit_fencing: kafka``), on the
real servicer, keeper and table (Kafka faked at its edge: stream_harness.FakeFetcher).

In ``lease`` mode a lease whose renewals stop (no assigner reachable) is suspended at its
local deadline: nothing is delivered or committed. With commits fenced at Kafka the
deadline is not needed for safety: a confirmed lease keeps delivering and committing until
an assigner takes it or Kafka fences it, and then it ends at once.
"""

from __future__ import annotations

import asyncio
import time

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.kafka_fenced_commits import LeaseFenced
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    GROUP,
    TOPIC,
    Sidecar,
    fetch_request,
    range_ack,
    run,
)

P = 0
TTL = 0.2


def ack(lo: int, hi: int, epoch: int = 1) -> stream_pb2.AckRequest:
    return stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(P, lo, hi, epoch)])


async def renewed_once_then_assigner_gone(sidecar: Sidecar) -> None:
    """A lease renewed once by a heartbeat ack (deadline TTL away), records buffered,
    then no assigner for several TTLs."""
    sidecar.fetcher.suspend = lambda _tp: None  # type: ignore[attr-defined]
    sidecar.hold(P, epoch=1, start=100, ttl=TTL)
    sidecar.keeper.renew(TP(TOPIC, P), 1, time.monotonic() + TTL)
    sidecar.buffer(P, range(100, 110))
    await asyncio.sleep(3 * TTL)  # several TTLs without a renewal
    await sidecar.keeper.suspend_expired()


def count(response: stream_pb2.FetchResponse) -> int:
    return len(response.records) + sum(b.count for b in response.batches)


def test_lease_mode_stops_delivering_and_committing_once_renewals_stop() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        await renewed_once_then_assigner_gone(sidecar)
        assert sidecar.table.partitions[TP(TOPIC, P)].suspended_at is not None
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 0

    run(body)


def test_kafka_fenced_lease_keeps_delivering_and_committing_past_its_ttl() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        sidecar.keeper.kafka_fenced = True
        await renewed_once_then_assigner_gone(sidecar)
        part = sidecar.table.partitions[TP(TOPIC, P)]
        assert part.suspended_at is None
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 10
        response = await stub.Ack(ack(100, 110))
        assert list(response.rejected_ranges) == []
        assert [(c.offset, c.epoch) for c in sidecar.fetcher.commits] == [(110, 1)]

    run(body)


def test_a_lease_fenced_at_kafka_ends_at_once_and_refuses_its_acks() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        sidecar.keeper.kafka_fenced = True
        sidecar.fetcher.unassign = lambda _tp: None  # type: ignore[method-assign]
        await renewed_once_then_assigner_gone(sidecar)
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 10

        sidecar.keeper.fenced_by_kafka(LeaseFenced(TP(TOPIC, P), 1, None))
        await asyncio.sleep(0.05)  # the drop runs on the loop
        assert sidecar.table.get(TP(TOPIC, P)) is None
        released = sidecar.keeper.take_released()
        assert [(r.tp.partition, r.epoch, r.committed) for r in released] == [(P, 1, -1)]
        response = await stub.Ack(ack(100, 110))
        assert [r.reason for r in response.rejected_ranges] == [stream_pb2.REJECT_REASON_NOT_HELD]
        assert sidecar.fetcher.commits == [], "nothing of a fenced lease is committed"

    run(body)
