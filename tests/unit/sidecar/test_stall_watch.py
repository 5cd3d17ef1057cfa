"""A sidecar that was itself away (SIGSTOP, a frozen VM) past what its leases outlast
(stall_watch.py): pure timing, then on the real table, keeper and servicer (Kafka faked at
its edge: stream_harness.FakeFetcher)."""

from __future__ import annotations

import asyncio
import math
import time

from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.partitions import Partition
from services.consumer_sidecar.stall_watch import StallWatch, stall_limit_for
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import GROUP, TOPIC, Sidecar, fetch_request, range_ack, run

P = 0


def test_the_stall_limit_is_half_of_what_a_lease_renewed_just_before_outlasts() -> None:
    assert stall_limit_for(ttl=3.0, heartbeat_interval=1.0) == 1.0
    assert stall_limit_for(ttl=10.0, heartbeat_interval=2.0) == 4.0
    assert stall_limit_for(ttl=0.5, heartbeat_interval=1.0) == 0.2  # never below 0.2 s


@given(
    st.floats(0.2, 10),
    st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=30),
)
def test_a_stall_is_counted_once_per_gap_longer_than_the_limit(
    limit: float, steps: list[float]
) -> None:
    watch = StallWatch(limit=limit)
    watch.seen(0.0)
    now = 0.0
    stalls = 0
    for step in steps:
        before, now = now, now + step
        gap = watch.seen(now)
        assert (gap is not None) == (now - before > limit)
        if gap is not None:
            assert gap == now - before
            stalls += 1
    assert watch.stalls == stalls


def test_no_limit_known_yet_means_no_stall() -> None:
    watch = StallWatch()
    assert watch.seen(0.0) is None  # the first sight: no gap to measure
    assert watch.seen(1e6) is None
    assert watch.stalls == 0 and math.isinf(watch.limit)


def test_a_clock_seen_late_by_another_thread_does_not_move_time_back() -> None:
    watch = StallWatch(limit=1.0)
    watch.seen(10.0)
    assert watch.seen(9.5) is None  # the other thread read the clock a moment earlier
    assert watch.alive_at == 10.0


def count(response: stream_pb2.FetchResponse) -> int:
    return len(response.records) + sum(b.count for b in response.batches)


def away(sidecar: Sidecar, seconds: float, limit: float = 1.0) -> None:
    """The process was stopped for ``seconds`` (nothing of it ran meanwhile); a stall is a
    gap longer than ``limit``."""
    sidecar.table.stall.limit = limit
    sidecar.table.stall.alive_at = time.monotonic() - seconds


def holding_records(sidecar: Sidecar, *, kafka_fenced: bool = True) -> Partition:
    """Partition P held (epoch 1, from offset 100) with records 100..109 fetched, its lease
    kafka-fenced (no deadline: a stall must hold it back) unless ``kafka_fenced`` is False
    (commit_fencing: lease, its deadline still ahead)."""
    sidecar.keeper.kafka_fenced = kafka_fenced
    part = sidecar.hold(P, epoch=1, start=100)
    sidecar.buffer(P, range(100, 110))
    return part


def test_after_a_stall_a_kafka_fenced_lease_delivers_once_a_commit_verified_it() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        holding_records(sidecar)
        away(sidecar, 8.0)
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 0
        part = sidecar.table.partitions[TP(TOPIC, P)]
        assert part.unverified == 1
        # Nothing was acked: the verifying commit is the same offset again, under the epoch.
        await sidecar.keeper.committer.commit_all()
        assert [(c.offset, c.epoch) for c in sidecar.fetcher.commits] == [(100, 1)]
        assert part.unverified == 0
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 10

    run(body)


def test_a_lease_whose_verifying_commit_was_not_made_stays_undelivered() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        holding_records(sidecar)
        away(sidecar, 8.0)
        sidecar.fetcher.drop = True  # not sent (as a fenced lease's commit is not)
        await sidecar.keeper.committer.commit_all()
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 0
        assert sidecar.table.partitions[TP(TOPIC, P)].unverified == 1

    run(body)


def test_acks_of_records_delivered_before_the_stall_verify_the_lease_too() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        holding_records(sidecar)
        assert count(await stub.Fetch(fetch_request(max_records=5))) == 5
        away(sidecar, 8.0)
        assert count(await stub.Fetch(fetch_request(max_records=5))) == 0
        acks = stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(P, 100, 105, 1)])
        response = await stub.Ack(acks)
        assert list(response.rejected_ranges) == []
        assert [(c.offset, c.epoch) for c in sidecar.fetcher.commits] == [(105, 1)]
        assert count(await stub.Fetch(fetch_request(max_records=5))) == 5

    run(body)


def test_a_stall_shorter_than_the_limit_changes_nothing() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        holding_records(sidecar)
        away(sidecar, 0.5, limit=60.0)  # far from the limit: a loaded machine's delays too
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 10
        assert sidecar.fetcher.commits == []

    run(body)


def test_leases_with_a_local_deadline_are_not_held_back_by_a_stall() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        holding_records(sidecar, kafka_fenced=False)  # its deadline still ahead
        away(sidecar, 8.0)
        assert count(await stub.Fetch(fetch_request(max_records=10))) == 10
        await asyncio.sleep(0)

    run(body)


def test_a_lease_not_set_up_at_the_stall_is_verified_once_it_is() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sidecar: Sidecar) -> None:
        sidecar.keeper.kafka_fenced = True
        part = sidecar.hold(P, epoch=1, start=100)
        part.ready = False  # its fetching is still being set up when the stall is seen
        committer = sidecar.keeper.committer
        committer.commit_interval = 0.05
        loop = asyncio.get_running_loop().create_task(committer.commit_loop())
        try:
            await asyncio.sleep(0.1)  # the loop runs, idle: nothing acked, no deadline
            away(sidecar, 8.0)
            sidecar.table.alive(time.monotonic())  # the fetch thread's turn sees the stall
            assert part.unverified == 1
            await asyncio.sleep(0.2)  # rounds ran: nothing to commit while not set up
            assert sidecar.fetcher.commits == []
            part.ready = True
            for _ in range(100):  # no ack will come: the loop must look again by itself
                if not part.unverified:
                    break
                await asyncio.sleep(0.05)
            assert part.unverified == 0
            assert [(c.offset, c.epoch) for c in sidecar.fetcher.commits] == [(100, 1)]
        finally:
            loop.cancel()

    run(body)
