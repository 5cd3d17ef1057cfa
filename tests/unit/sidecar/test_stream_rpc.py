"""StreamService Stream, Ack, ReadRange and CommitOffsets through an in-process gRPC server.

The servicer runs on a real grpc.aio server on port 0, given a real Serving over a real
PartitionTable and LeaseKeeper; only Kafka is faked (the fetcher's commit and the range
readers): ``stream_harness.py``. Each RPC's validation and error mapping:
``test_stream_rpc_errors.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest
from confluent_kafka import KafkaError

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.records.batches import decode_batch
from services.consumer_sidecar.reader import Chunk, RangeRead, RangeSpec
from services.consumer_sidecar.stream_flow import Credit
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    GROUP,
    TOPIC,
    FakeReaders,
    Requests,
    Sidecar,
    acks_of,
    commit,
    fetch_request,
    opening,
    range_ack,
    read_all,
    read_request,
    reason_of,
    run,
)

# ---- Credit ---------------------------------------------------------------------------


def test_credit_counts_bytes_only_once_granted() -> None:
    credit = Credit()
    assert not credit.available()
    credit.add(10, 0)
    assert credit.available() and credit.limits(500, 1 << 20) == (10, 1 << 20)
    credit.spend(4, 10_000)
    assert credit.records == 6 and credit.bytes is None
    credit.add(0, 100)
    assert credit.limits(500, 1 << 20) == (6, 100)
    credit.spend(1, 150)  # a batch may overdraw: at least one record
    assert not credit.available()
    credit.add(0, 60)
    assert credit.available()


# ---- Stream ---------------------------------------------------------------------------


def test_stream_sends_within_credit_and_answers_acks() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=3)
        sc.buffer(0, range(10))
        requests = Requests(opening(records=4))
        call = stub.Stream(requests)
        first = await call.read()
        assert first.WhichOneof("kind") == "batch"
        got = list(first.batch.records)
        assert [r.offset for r in got] == [0, 1, 2, 3]
        assert {r.lease_epoch for r in got} == {3}
        # No credit left: nothing more arrives until the client grants some.
        pending = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait([pending], timeout=0.7)
        assert not done
        requests.send(stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=100)))
        got.extend((await pending).batch.records)
        while len(got) < 10:
            response = await call.read()
            assert response.WhichOneof("kind") == "batch"
            got.extend(response.batch.records)
        assert [r.offset for r in got] == list(range(10))
        assert part.acks.inflight == 10
        stale = acks_of(got[:1], epoch=2)
        requests.send(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(acks=acks_of(got))))
        requests.send(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(acks=stale)))
        result = await call.read()
        assert result.ack_result.acked_count == 10 and not result.ack_result.rejected_acks
        result = await call.read()
        assert result.ack_result.acked_count == 0
        assert [r.reason for r in result.ack_result.rejected_acks] == [
            stream_pb2.REJECT_REASON_STALE_EPOCH
        ]
        assert part.acks.commit_point == 10 and part.acks.inflight == 0
        requests.send(None)  # half-close ends the stream
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

    run(body)


def test_stream_byte_credit_and_auto_ack() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(1)
        sc.buffer(1, range(5))  # values of 2 bytes each
        requests = Requests(opening(records=100, nbytes=3, auto_ack=True))
        call = stub.Stream(requests)
        response = await call.read()
        assert [r.offset for r in response.batch.records] == [0]  # at least one record
        requests.send(stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(bytes=1)))
        response = await call.read()  # 3 - 2 + 1 = 2 bytes of credit: one record
        assert [r.offset for r in response.batch.records] == [1]
        # auto_ack acks a record once it was written: the server's generator resumes after
        # the write, which may be a moment after this side read it.
        for _ in range(100):
            if part.acks.inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert part.acks.inflight == 0 and part.acks.commit_point == 2
        call.cancel()

    run(body)


def test_stream_records_arriving_later_are_sent() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        call = stub.Stream(Requests(opening(records=100)))
        await asyncio.sleep(0.2)
        sc.buffer(0, range(3))
        response = await call.read()
        assert [r.offset for r in response.batch.records] == [0, 1, 2]
        call.cancel()

    run(body)


@pytest.mark.parametrize(
    ("first", "code", "reason", "field"),
    [
        (
            stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "open",
        ),
        (opening(client_id=""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "client_id"),
        (opening(group=""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "group"),
        (opening(group="other"), grpc.StatusCode.NOT_FOUND, "GROUP_NOT_SERVED", None),
        (
            opening(records=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "open.initial_credit.records",
        ),
    ],
)
def test_stream_bad_open(
    first: stream_pb2.StreamRequest, code: grpc.StatusCode, reason: str, field: str | None
) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        call = stub.Stream(Requests(first))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        got_code, got_reason, metadata = reason_of(caught.value)
        assert (got_code, got_reason) == (code, reason)
        if field:
            assert metadata["field"] == field

    run(body)


@pytest.mark.parametrize(
    ("later", "field"),
    [
        (opening(), "open"),
        (stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(bytes=-5)), "credit.bytes"),
        (
            stream_pb2.StreamRequest(
                acks=stream_pb2.StreamAcks(
                    acks=[stream_pb2.RecordAck(topic=TOPIC, partition=0, offset=-1)]
                )
            ),
            "acks.acks.offset",
        ),
    ],
)
def test_stream_bad_later_message_ends_stream(later: stream_pb2.StreamRequest, field: str) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        call = stub.Stream(Requests(opening(), later))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        code, reason, metadata = reason_of(caught.value)
        assert (code, reason, metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field,
        )

    run(body)


# ---- Ack ------------------------------------------------------------------------------


def test_ack_all_stale_is_failed_precondition_mixed_is_per_record() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=5)
        sc.buffer(0, range(3))
        delivered = [r for s in sc.table.take(10, 1 << 20) for r in s.to_records()]
        stale = acks_of(delivered, epoch=4)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Ack(stream_pb2.AckRequest(client_id="c", group=GROUP, acks=stale))
        code, reason, metadata = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EPOCH_STALE")
        assert metadata == {
            "topic": TOPIC,
            "partition": "0",
            "epoch": "4",
            "current_epoch": "5",
            "stale_acks": "3",
        }
        mixed = [*acks_of(delivered[:1]), *stale[1:]]
        response = await stub.Ack(stream_pb2.AckRequest(client_id="c", group=GROUP, acks=mixed))
        assert response.acked_count == 1
        assert [r.reason for r in response.rejected_acks] == [
            stream_pb2.REJECT_REASON_STALE_EPOCH
        ] * 2
        # Not held is per record too (the partition moved away: nothing to fence here).
        gone = stream_pb2.RecordAck(topic=TOPIC, partition=9, offset=0, lease_epoch=1)
        response = await stub.Ack(stream_pb2.AckRequest(client_id="c", group=GROUP, acks=[gone]))
        assert [r.reason for r in response.rejected_acks] == [stream_pb2.REJECT_REASON_NOT_HELD]

    run(body)


def test_ack_validation() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        cases = [
            (stream_pb2.AckRequest(client_id="c", group=GROUP), "acks"),
            (
                stream_pb2.AckRequest(
                    client_id="c",
                    group=GROUP,
                    acks=[stream_pb2.RecordAck(topic=TOPIC, partition=-1, offset=0)],
                ),
                "acks.partition",
            ),
            (
                stream_pb2.AckRequest(
                    client_id="c", group=GROUP, acks=[stream_pb2.RecordAck(partition=0)]
                ),
                "acks.topic",
            ),
        ]
        for request, field_name in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Ack(request)
            assert reason_of(caught.value)[0] == grpc.StatusCode.INVALID_ARGUMENT
            assert reason_of(caught.value)[2]["field"] == field_name

    run(body)


# ---- DELIVERY_FORMAT_BATCHES and range acks -------------------------------------------


def test_fetch_batches_carry_the_epoch_and_decode_to_the_records() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=3)
        sc.hold(1, epoch=5)
        sc.buffer(0, range(4))
        sc.buffer(1, range(10, 13))
        batches = stream_pb2.DELIVERY_FORMAT_BATCHES
        response = await stub.Fetch(fetch_request(format=batches))
        assert not response.records
        got = {(b.partition, b.lease_epoch): decode_batch(b) for b in response.batches}
        assert {k: [(r.offset, r.value) for r in v] for k, v in got.items()} == {
            (0, 3): [(o, b"v%d" % o) for o in range(4)],
            (1, 5): [(o, b"v%d" % o) for o in range(10, 13)],
        }
        assert all(r.lease_epoch == epoch for (_, epoch), v in got.items() for r in v)
        # The default (an older client) is one Record message per record.
        sc.buffer(0, range(4, 6))
        legacy = await stub.Fetch(fetch_request())
        assert [(r.offset, r.lease_epoch) for r in legacy.records] == [(4, 3), (5, 3)]
        assert not legacy.batches
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Fetch(fetch_request(format=9))
        assert reason_of(caught.value)[2]["field"] == "format"

    run(body)


def test_range_acks_commit_and_count_like_record_acks() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        p0 = sc.hold(0, epoch=3)
        sc.hold(1, epoch=5)
        sc.buffer(0, range(10))
        sc.buffer(1, range(4))
        await stub.Fetch(fetch_request(format=stream_pb2.DELIVERY_FORMAT_BATCHES))
        # Out of order: the upper half first, then the lower, with a stale range between.
        response = await stub.Ack(
            stream_pb2.AckRequest(
                client_id="c",
                group=GROUP,
                ranges=[range_ack(0, 5, 10, 3), range_ack(1, 0, 4, 4), range_ack(0, 0, 11, 3)],
            )
        )
        assert response.acked_count == 1
        assert [(r.ack.partition, r.reason) for r in response.rejected_ranges] == [
            (1, stream_pb2.REJECT_REASON_STALE_EPOCH),
            (0, stream_pb2.REJECT_REASON_NOT_DELIVERED),  # 10 was never delivered
        ]
        assert p0.acks.commit_point == 0 and p0.acks.inflight == 5
        assert sc.fetcher.commits[-1].acked == ((5, 9),)  # acked above the commit point
        response = await stub.Ack(
            stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(0, 0, 5, 3)])
        )
        assert response.acked_count == 1 and not response.rejected_ranges
        assert p0.acks.commit_point == 10
        last = sc.fetcher.commits[-1]
        assert (last.tp.partition, last.offset, last.epoch) == (0, 10, 3)
        # Only stale ranges: the whole request fails, as with record acks.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Ack(
                stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(1, 0, 4, 4)])
            )
        code, reason, metadata = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EPOCH_STALE")
        assert (metadata["partition"], metadata["current_epoch"]) == ("1", "5")
        for bad, field_name in (
            (range_ack(0, 5, 5, 3), "ranges.to_offset"),
            (range_ack(0, -1, 5, 3), "ranges.from_offset"),
            (stream_pb2.RangeAck(partition=0, from_offset=0, to_offset=1), "ranges.topic"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Ack(stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[bad]))
            assert reason_of(caught.value)[2]["field"] == field_name

    run(body)


def test_stream_batches_with_range_acks_and_auto_ack() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        sc.buffer(0, range(6))
        opened = opening(records=4)
        opened.open.format = stream_pb2.DELIVERY_FORMAT_BATCHES
        requests = Requests(opened)
        call = stub.Stream(requests)
        first = await call.read()
        (batch,) = first.batch.batches
        assert [r.offset for r in decode_batch(batch)] == [0, 1, 2, 3]
        acks = stream_pb2.StreamAcks(ranges=[range_ack(0, 0, 4, 2)])
        requests.send(stream_pb2.StreamRequest(acks=acks))
        result = await call.read()
        assert result.ack_result.acked_count == 1 and not result.ack_result.rejected_ranges
        assert part.acks.commit_point == 4
        call.cancel()

        auto = opening(records=100, auto_ack=True)
        auto.open.format = stream_pb2.DELIVERY_FORMAT_BATCHES
        call = stub.Stream(Requests(auto))
        response = await call.read()
        assert [r.offset for b in response.batch.batches for r in decode_batch(b)] == [4, 5]
        assert part.acks.inflight == 0 and part.acks.commit_point == 6
        call.cancel()

    run(body)


# ---- CommitOffsets --------------------------------------------------------------------


def test_commit_offsets_fenced_by_epoch_and_lease() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        p0 = sc.hold(0, epoch=2)
        sc.hold(1, epoch=7)
        sc.hold(2, epoch=1, ttl=-1)  # local deadline passed
        p3 = sc.hold(3, epoch=1)
        p3.high_watermark = 40  # stale statistics: Kafka (FakeReaders) says 1000
        # What ReadRange gave the committing client (commits are bound to it).
        sc.serving.range_given(TP(TOPIC, 0), 2, "spark", 0, 120)
        sc.serving.range_given(TP(TOPIC, 3), 1, "spark", 0, 500)
        request = stream_pb2.CommitOffsetsRequest(
            client_id="spark",
            group=GROUP,
            offsets=[
                commit(0, 120, 2),
                commit(1, 5, 6),
                commit(2, 5, 1),
                commit(3, 500, 1),
                commit(4, 5, 1),
                commit(0 + 5, 10, 1),
            ],
        )
        sc.hold(5, epoch=1)
        request.offsets[5].offset = 1001  # beyond the high watermark
        response = await stub.CommitOffsets(request)
        got = [(r.commit.partition, r.committed, r.reason) for r in response.results]
        assert got == [
            (0, True, stream_pb2.REJECT_REASON_UNSPECIFIED),
            (1, False, stream_pb2.REJECT_REASON_STALE_EPOCH),
            (2, False, stream_pb2.REJECT_REASON_LEASE_EXPIRED),
            (3, True, stream_pb2.REJECT_REASON_UNSPECIFIED),
            (4, False, stream_pb2.REJECT_REASON_NOT_HELD),
            (5, False, stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE),
        ]
        assert [(c.tp.partition, c.offset, c.epoch) for c in sc.fetcher.commits] == [
            (0, 120, 2),
            (3, 500, 1),
        ]
        assert p0.committed == 120 and p3.committed == 500
        # The ack-driven committer never goes back below an explicit commit.
        sc.buffer(0, range(5))
        delivered = [r for s in sc.table.take(10, 1 << 20) for r in s.to_records()]
        for record in delivered:
            p0.acks.ack(record.offset)
        await sc.keeper.committer.commit_all()
        assert len(sc.fetcher.commits) == 2 and p0.committed == 120

    run(body)


def test_commit_offsets_validation() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        cases = [
            (stream_pb2.CommitOffsetsRequest(client_id="s", group=GROUP), "offsets"),
            (
                stream_pb2.CommitOffsetsRequest(
                    client_id="s", group=GROUP, offsets=[commit(0, -1, 1)]
                ),
                "offsets.offset",
            ),
            (
                stream_pb2.CommitOffsetsRequest(
                    client_id="s", group=GROUP, offsets=[commit(0, 1, 1), commit(0, 2, 1)]
                ),
                "offsets",
            ),
            (stream_pb2.CommitOffsetsRequest(group=GROUP, offsets=[commit(0, 1, 1)]), "client_id"),
        ]
        for request, field_name in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.CommitOffsets(request)
            code, reason, metadata = reason_of(caught.value)
            assert (code, reason, metadata["field"]) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_FIELD",
                field_name,
            )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CommitOffsets(
                stream_pb2.CommitOffsetsRequest(client_id="s", group="x", offsets=[commit(0, 1, 1)])
            )
        assert reason_of(caught.value)[:2] == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_SERVED")

    run(body)


# ---- ReadRange ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"topic": ""}, "topic"),
        ({"partition": -1}, "partition"),
        ({"from_offset": -1}, "from_offset"),
        ({"from_offset": 5, "to_offset": 4}, "to_offset"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"max_bytes": 64 * 1024 * 1024 + 1}, "max_bytes"),
        ({"format": 9}, "format"),
        ({"client_id": ""}, "client_id"),
    ],
)
def test_read_range_validation(fields: dict[str, Any], field_name: str) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await read_all(stub, read_request(**fields))
        code, reason, metadata = reason_of(caught.value)
        assert (code, reason, metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            field_name,
        )

    run(body)


def test_read_range_needs_a_live_lease() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(1, ttl=-1)
        revoking = sc.hold(2)
        revoking.revoking = True
        for partition, state in [(0, "NOT_HELD"), (1, "LEASE_EXPIRED"), (2, "NOT_HELD")]:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await read_all(stub, read_request(partition=partition))
            code, reason, metadata = reason_of(caught.value)
            assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_NOT_HELD")
            assert metadata["state"] == state and metadata["partition"] == str(partition)
            assert metadata["group"] == GROUP and metadata["sidecar_id"] == "sc-1"

    run(body)


def test_read_range_streams_chunks_with_epoch_and_empty_range() -> None:
    readers = FakeReaders(
        chunks=[
            Chunk([common_pb2.Record(topic=TOPIC, offset=o) for o in (0, 1)], next_offset=4),
            Chunk([common_pb2.Record(topic=TOPIC, offset=o) for o in (4, 5)], next_offset=10),
        ]
    )

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=9)
        responses = await read_all(stub, read_request(max_bytes=100))
        assert [(len(r.records), r.lease_epoch, r.next_offset) for r in responses] == [
            (2, 9, 4),
            (2, 9, 10),
        ]
        assert readers.opened[0].max_bytes == 100 and readers.opened[0].epoch == 9
        empty = await read_all(stub, read_request(from_offset=7, to_offset=7))
        assert [(len(r.records), r.next_offset) for r in empty] == [(0, 7)]
        assert len(readers.opened) == 1  # an empty range never touches Kafka

    run(body, readers=readers)


def test_read_range_in_arrow_ipc_asks_the_reader_for_arrow_and_sends_its_stream() -> None:
    readers = FakeReaders(chunks=[Chunk([], next_offset=10, arrow_ipc=b"IPC", count=10)])

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0, epoch=3)
        request = read_request(format=stream_pb2.READ_FORMAT_ARROW_IPC)
        responses = await read_all(stub, request)
        assert [(r.arrow_ipc, len(r.records), r.lease_epoch) for r in responses] == [(b"IPC", 0, 3)]
        assert readers.opened[0].arrow is True
        await read_all(stub, read_request())
        assert readers.opened[1].arrow is False

    run(body, readers=readers)


# ---- RangeRead (chunking over a fake consumer) ----------------------------------------


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return False

    def str(self) -> str:
        return str(self._code)


class FakeMessage:
    def __init__(self, offset: int, value: bytes = b"", error: FakeError | None = None) -> None:
        self._offset = offset
        self._value = value
        self._error = error

    def error(self) -> FakeError | None:
        return self._error

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 0, -1

    def headers(self) -> None:
        return None


class FakeConsumer:
    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = batches
        self.closed = False

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        self.closed = True


def chunks_of(read: RangeRead) -> list[tuple[list[int], int]]:
    out = []
    while (chunk := read.next_chunk()) is not None:
        out.append(([r.offset for r in chunk.records], chunk.next_offset))
    return out


def test_range_read_chunks_skip_gaps_and_stop_at_end() -> None:
    # Offsets 3 and 6 are gaps (compaction / transaction markers); 9 is beyond the range.
    messages = [FakeMessage(o, b"x" * 10) for o in (0, 1, 2, 4, 5, 7, 8, 9)]
    consumer = FakeConsumer([messages[:3], messages[3:]])
    one = common_pb2.Record(topic=TOPIC, offset=1, value=b"x" * 10, lease_epoch=4).ByteSize()
    spec = RangeSpec(TP(TOPIC, 0), 0, 9, max_bytes=3 * (one + 8), epoch=4)
    read = RangeRead(consumer, spec, stall_timeout=1)  # type: ignore[arg-type]
    got = chunks_of(read)
    assert [offsets for offsets, _ in got] == [[0, 1, 2], [4, 5, 7], [8]]
    assert [next_offset for _, next_offset in got] == [4, 8, 9]
    read.close()
    assert consumer.closed


def test_range_read_tail_of_gaps_ends_at_partition_eof() -> None:
    eof = FakeMessage(10, error=FakeError(KafkaError._PARTITION_EOF))
    consumer = FakeConsumer([[FakeMessage(5, b"a")], [eof]])
    spec = RangeSpec(TP(TOPIC, 0), 5, 10, max_bytes=1 << 20, epoch=1)
    read = RangeRead(consumer, spec, stall_timeout=1)  # type: ignore[arg-type]
    assert chunks_of(read) == [([5], 10)]


def test_range_read_stalls_into_an_error() -> None:
    from services.consumer_sidecar.reader import ReadStalled

    spec = RangeSpec(TP(TOPIC, 0), 0, 10, max_bytes=1 << 20, epoch=1)
    read = RangeRead(FakeConsumer([]), spec, stall_timeout=0.3)  # type: ignore[arg-type]
    with pytest.raises(ReadStalled):
        read.next_chunk()
