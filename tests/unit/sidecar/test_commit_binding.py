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
OUT_OF_RANGE = stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE


def test_only_the_reading_client_commits_and_only_up_to_what_it_was_given() -> None:
    reads = RangeReads()
    reads.given(T0, 3, "spark", 0, 40)
    reads.given(T0, 3, "spark", 0, 25)  # an earlier range read again: the reach stays 40
    assert reads.commit_problem(T0, 3, "spark", 40, committed=0) is None
    assert reads.commit_problem(T0, 3, "spark", 0, committed=0) is None
    beyond = reads.commit_problem(T0, 3, "spark", 41, committed=0)
    assert beyond is not None and beyond[0] == NOT_DELIVERED
    assert "from 40" in beyond[1]
    other = reads.commit_problem(T0, 3, "intruder", 10, committed=0)
    assert other is not None and other[0] == NOT_HOLDER
    assert "another client" in other[1]
    nothing = reads.commit_problem(TP(TOPIC, 1), 3, "spark", 1, committed=0)
    assert nothing is not None and nothing[0] == NOT_DELIVERED


def test_a_commit_past_a_record_never_read_or_below_the_committed_offset_is_refused() -> None:
    reads = RangeReads()
    reads.given(T0, 3, "spark", 90, 100)  # the last records only
    skipping = reads.commit_problem(T0, 3, "spark", 100, committed=0)
    assert skipping is not None and skipping[0] == NOT_DELIVERED and "from 0" in skipping[1]
    assert reads.commit_problem(T0, 3, "spark", 100, committed=90) is None
    reads.given(T0, 3, "spark", 0, 50)  # a hole: [50, 90)
    hole = reads.commit_problem(T0, 3, "spark", 95, committed=0)
    assert hole is not None and hole[0] == NOT_DELIVERED and "from 50" in hole[1]
    assert reads.commit_problem(T0, 3, "spark", 50, committed=0) is None
    backward = reads.commit_problem(T0, 3, "spark", 40, committed=50)
    assert backward is not None and backward[0] == OUT_OF_RANGE and "backward" in backward[1]


def test_a_new_epoch_starts_with_nothing_given() -> None:
    reads = RangeReads()
    reads.given(T0, 3, "spark", 0, 40)
    reads.given(T0, 4, "spark", 0, 10)
    assert reads.reach(T0, 3, "spark") is None  # the old epoch is gone with its lease
    assert reads.commit_problem(T0, 4, "spark", 10, committed=0) is None
    problem = reads.commit_problem(T0, 4, "spark", 40, committed=0)
    assert problem is not None and problem[0] == NOT_DELIVERED
    reads.given(T0, 3, "late", 0, 99)  # a read of the old epoch finishing late: ignored
    assert reads.reach(T0, 4, "late") is None and reads.reach(T0, 3, "late") is None


def test_clients_tracked_per_partition_are_bounded_least_recently_served_first() -> None:
    reads = RangeReads(max_clients=2)
    reads.given(T0, 1, "a", 0, 5)
    reads.given(T0, 1, "b", 0, 5)
    reads.given(T0, 1, "a", 5, 6)  # a served again: b is now the least recent
    reads.given(T0, 1, "c", 0, 5)
    assert reads.reach(T0, 1, "b") is None
    assert (reads.reach(T0, 1, "a"), reads.reach(T0, 1, "c")) == (6, 5)


def test_spans_per_client_are_bounded_lowest_first() -> None:
    reads = RangeReads(max_spans=2)
    for lo in (0, 10, 20):
        reads.given(T0, 1, "a", lo, lo + 5)
    assert reads.commit_problem(T0, 1, "a", 25, committed=20) is None
    forgotten = reads.commit_problem(T0, 1, "a", 5, committed=0)  # [0, 5) was forgotten
    assert forgotten is not None and forgotten[0] == NOT_DELIVERED


@given(
    reads_=st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]), st.integers(1, 2), st.integers(0, 50), st.integers(0, 10)
        ),
        max_size=12,
    ),
    caller=st.sampled_from(["a", "b", "c"]),
    epoch=st.integers(1, 2),
    offset=st.integers(0, 60),
    committed=st.integers(0, 60),
)
def test_a_commit_is_accepted_iff_the_caller_was_given_every_record_it_moves_past(
    reads_: list[tuple[str, int, int, int]], caller: str, epoch: int, offset: int, committed: int
) -> None:
    reads = RangeReads()
    latest = 0
    for client, read_epoch, lo, length in reads_:
        reads.given(T0, read_epoch, client, lo, lo + length)
        latest = max(latest, read_epoch)
    given_ = {
        o
        for c, ep, lo, length in reads_
        if c == caller and ep == epoch
        for o in range(lo, lo + length)
    }
    accepted = (
        epoch == latest
        and bool(given_)
        and offset >= committed
        and all(o in given_ for o in range(committed, offset))
    )
    problem = reads.commit_problem(T0, epoch, caller, offset, committed)
    assert (problem is None) == accepted
    if problem is not None and given_ and epoch == latest:
        assert problem[0] == (OUT_OF_RANGE if offset < committed else NOT_DELIVERED)


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


# ---- issue 37, finding 9: no commit skips unread records, none goes backward ------------


async def _commit_as(
    stub: stream_pb2_grpc.StreamServiceStub, client: str, offset: int, epoch: int = 5
) -> stream_pb2.OffsetCommitResult:
    request = stream_pb2.CommitOffsetsRequest(
        client_id=client, group=GROUP, offsets=[commit(0, offset, epoch)]
    )
    (result,) = (await stub.CommitOffsets(request)).results
    return result


def test_on_the_servicer_reading_the_last_record_does_not_let_a_commit_skip_the_others() -> None:
    readers = FakeReaders(chunks=_chunks((999, 1000)))

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=5)  # the group committed 0; the high watermark is 1000
        await read_all(stub, read_request(from_offset=999, to_offset=1000))
        skipping = await _commit_as(stub, "spark", 1000)
        print("read [999, 1000) with 0 committed, committed 1000:", skipping)
        assert (skipping.committed, skipping.reason) == (False, NOT_DELIVERED), skipping
        assert "from 0" in skipping.message, "names the first record never read"
        assert sc.fetcher.commits == [] and part.committed == 0

    run(body, readers)


def test_on_the_servicer_a_commit_never_goes_backward() -> None:
    readers = FakeReaders(chunks=_chunks((0, 4), (4, 10)))

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=5)
        await read_all(stub, read_request(to_offset=10))
        assert (await _commit_as(stub, "spark", 10)).committed
        backward = await _commit_as(stub, "spark", 4)
        print("committed 10, then 4:", backward)
        assert (backward.committed, backward.reason) == (
            False,
            stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
        ), backward
        assert "backward" in backward.message
        assert [c.offset for c in sc.fetcher.commits] == [10] and part.committed == 10
        again = await _commit_as(stub, "spark", 10)  # the same offset again: no move, fine
        assert again.committed, again

    run(body, readers)
