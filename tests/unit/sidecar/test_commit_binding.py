"""Explicit commits are bound to the client ReadRange gave the records to (issue 18, item 4):
before, any caller of the group that knew a partition's epoch could ``CommitOffsets`` any
offset of it, skipping records it never read. Now a commit of ``offset`` under ``epoch`` is
accepted only from a client that ReadRange gave records up to ``offset`` under that epoch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.range_reads import RangeReads
from services.consumer_sidecar.reader import Chunk
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    GROUP,
    TOPIC,
    FakeReaders,
    Sidecar,
    commit,
    read_all,
    read_request,
    run,
)

T0 = TP(TOPIC, 0)
NOT_HOLDER = stream_pb2.REJECT_REASON_NOT_HOLDER
NOT_DELIVERED = stream_pb2.REJECT_REASON_NOT_DELIVERED


def test_only_the_reading_client_commits_and_only_up_to_what_it_was_given() -> None:
    reads = RangeReads()
    reads.given(T0, 3, "spark", 40)
    reads.given(T0, 3, "spark", 25)  # an earlier range read again: the reach stays 40
    assert reads.commit_problem(T0, 3, "spark", 40) is None
    assert reads.commit_problem(T0, 3, "spark", 0) is None
    beyond = reads.commit_problem(T0, 3, "spark", 41)
    assert beyond is not None and beyond[0] == NOT_DELIVERED
    assert "beyond 40" in beyond[1]
    other = reads.commit_problem(T0, 3, "intruder", 10)
    assert other is not None and other[0] == NOT_HOLDER
    assert "another client" in other[1]
    nothing = reads.commit_problem(TP(TOPIC, 1), 3, "spark", 1)
    assert nothing is not None and nothing[0] == NOT_DELIVERED


def test_a_new_epoch_starts_with_nothing_given() -> None:
    reads = RangeReads()
    reads.given(T0, 3, "spark", 40)
    reads.given(T0, 4, "spark", 10)
    assert reads.reach(T0, 3, "spark") is None  # the old epoch is gone with its lease
    assert reads.commit_problem(T0, 4, "spark", 10) is None
    problem = reads.commit_problem(T0, 4, "spark", 40)
    assert problem is not None and problem[0] == NOT_DELIVERED
    reads.given(T0, 3, "late", 99)  # a read of the old epoch finishing late: ignored
    assert reads.reach(T0, 4, "late") is None and reads.reach(T0, 3, "late") is None


def test_clients_tracked_per_partition_are_bounded_least_recently_served_first() -> None:
    reads = RangeReads(max_clients=2)
    reads.given(T0, 1, "a", 5)
    reads.given(T0, 1, "b", 5)
    reads.given(T0, 1, "a", 6)  # a served again: b is now the least recent
    reads.given(T0, 1, "c", 5)
    assert reads.reach(T0, 1, "b") is None
    assert (reads.reach(T0, 1, "a"), reads.reach(T0, 1, "c")) == (6, 5)


@given(
    reads_=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 2), st.integers(0, 50)),
        max_size=12,
    ),
    caller=st.sampled_from(["a", "b", "c"]),
    epoch=st.integers(1, 2),
    offset=st.integers(0, 60),
)
def test_a_commit_is_accepted_iff_the_caller_was_given_that_far_under_the_latest_epoch(
    reads_: list[tuple[str, int, int]], caller: str, epoch: int, offset: int
) -> None:
    reads = RangeReads()
    latest = 0
    for client, read_epoch, end in reads_:
        reads.given(T0, read_epoch, client, end)
        latest = max(latest, read_epoch)
    ends = [e for c, ep, e in reads_ if c == caller and ep == epoch]
    accepted = epoch == latest and bool(ends) and offset <= max(ends)
    problem = reads.commit_problem(T0, epoch, caller, offset)
    assert (problem is None) == accepted
    if problem is not None and ends and epoch == latest:
        assert problem[0] == NOT_DELIVERED  # given some, but not that far


def _chunks(*ranges: tuple[int, int]) -> list[Chunk]:
    return [
        Chunk([common_pb2.Record(topic=TOPIC, offset=o) for o in range(lo, hi)], next_offset=hi)
        for lo, hi in ranges
    ]


def test_on_the_servicer_another_client_cannot_commit_past_what_spark_read() -> None:
    readers = FakeReaders(chunks=_chunks((0, 4), (4, 10)))

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=5)
        await read_all(stub, read_request(client_id="spark", to_offset=10))

        async def commit_as(client: str, offset: int) -> stream_pb2.OffsetCommitResult:
            request = stream_pb2.CommitOffsetsRequest(
                client_id=client, group=GROUP, offsets=[commit(0, offset, 5)]
            )
            (result,) = (await stub.CommitOffsets(request)).results
            return result

        intruder = await commit_as("intruder", 10)
        assert (intruder.committed, intruder.reason) == (False, NOT_HOLDER), intruder
        skipping = await commit_as("spark", 500)  # below the high watermark, never read
        assert (skipping.committed, skipping.reason) == (False, NOT_DELIVERED), skipping
        assert sc.fetcher.commits == [] and part.committed == 0  # nothing of them committed
        owner = await commit_as("spark", 10)
        assert owner.committed and owner.reason == stream_pb2.REJECT_REASON_UNSPECIFIED
        assert [(c.tp.partition, c.offset, c.epoch) for c in sc.fetcher.commits] == [(0, 10, 5)]

    run(body, readers)


def test_on_the_servicer_lease_refusals_come_before_the_binding() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=5)
        request = stream_pb2.CommitOffsetsRequest(
            client_id="intruder", group=GROUP, offsets=[commit(0, 3, 4), commit(1, 3, 1)]
        )
        reasons = [r.reason for r in (await stub.CommitOffsets(request)).results]
        assert reasons == [stream_pb2.REJECT_REASON_STALE_EPOCH, stream_pb2.REJECT_REASON_NOT_HELD]

    run(body)
