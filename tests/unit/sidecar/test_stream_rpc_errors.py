"""Every StreamService RPC's request validation and error mapping, in-process.

The real servicer on a grpc.aio server on port 0, given a real Serving over a real
PartitionTable and LeaseKeeper (``stream_harness.py``); Kafka is replaced at its edge only.
Each bad request gets the status code and ErrorInfo reason of README "Errors"
(``clients/python/src/dsclient/reasons.py``), with the field or coordinates in its metadata.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio
import pytest
from confluent_kafka import KafkaError, KafkaException
from google.protobuf import duration_pb2

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.reader import Chunk, RangeOutOfRange, ReadStalled
from services.consumer_sidecar.request_checks import MAX_ACKS, MAX_BYTES, MAX_COMMITS, MAX_RECORDS
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import (
    CONSUMER_CONFIG,
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

Stub = stream_pb2_grpc.StreamServiceStub
INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
NOT_SERVED = (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_SERVED")
NOT_READY = (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")
KAFKA_DOWN = (grpc.StatusCode.UNAVAILABLE, "KAFKA_UNAVAILABLE")


def transport_error() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))


async def failure(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status of an awaited unary call or of the first read of a streaming one."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await (call.read() if hasattr(call, "read") else call)
    return reason_of(caught.value)


def invalid_field(got: tuple[grpc.StatusCode, str, dict[str, str]], field_name: str) -> None:
    code, reason, metadata = got
    assert (code, reason, metadata.get("field")) == (*INVALID, field_name)


def delivered(sc: Sidecar, partition: int, offsets: range) -> list[common_pb2.Record]:
    """Buffer ``offsets`` of a held partition and deliver them, as a Fetch would."""
    sc.buffer(partition, offsets)
    return [r for s in sc.table.take(len(offsets), 1 << 20) for r in s.to_records()]


# ---- Fetch ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"client_id": ""}, "client_id"),
        ({"group": ""}, "group"),
        ({"max_records": MAX_RECORDS + 1}, "max_records"),
        ({"max_records": -1}, "max_records"),
        ({"max_bytes": MAX_BYTES + 1}, "max_bytes"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"wait_ms": 30_001}, "max_wait"),
        ({"wait_ms": -1}, "max_wait"),
        ({"format": 9}, "format"),
    ],
)
def test_fetch_validation(fields: dict[str, Any], field_name: str) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        invalid_field(await failure(stub.Fetch(fetch_request(**fields))), field_name)

    run(body)


def test_fetch_with_a_max_wait_outside_durations_range_is_invalid() -> None:
    """Any int64 seconds may come over the wire; ToTimedelta() overflowed (UNKNOWN)."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        request = fetch_request()
        request.max_wait.seconds = 2**63 - 1
        invalid_field(await failure(stub.Fetch(request)), "max_wait")

    run(body)


def test_fetch_for_another_group_is_not_served() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        code, reason, metadata = await failure(stub.Fetch(fetch_request(group="other")))
        assert (code, reason) == NOT_SERVED
        assert metadata == {"group": "other", "served_group": GROUP}

    run(body)


def test_fetch_and_stream_before_the_sidecar_joined_are_not_ready() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.connected = False  # no session yet, and nothing held
        assert (await failure(stub.Fetch(fetch_request())))[:2] == NOT_READY
        assert (await failure(stub.Stream(Requests(opening(records=1)))))[:2] == NOT_READY
        # A broken session keeps serving the leases still held.
        sc.hold(0)
        sc.buffer(0, range(2))
        response = await stub.Fetch(fetch_request())
        assert [r.offset for r in response.records] == [0, 1]

    run(body)


def test_fetch_long_polls_until_records_arrive() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        started = time.monotonic()
        empty = await stub.Fetch(fetch_request(wait_ms=200))
        assert not empty.records and time.monotonic() - started >= 0.2
        call = asyncio.ensure_future(stub.Fetch(fetch_request(wait_ms=10_000)))
        await asyncio.sleep(0.2)
        sc.buffer(0, range(3))
        response = await asyncio.wait_for(call, 5)
        assert [r.offset for r in response.records] == [0, 1, 2]

    run(body)


async def answer_of(stub: Stub, seq: int) -> stream_pb2.StreamAckResult:
    """The answer to the acks carried with ``seq``: in a response to a later fetch of the
    same client (without acks), once their commit has been made."""
    for _ in range(50):
        response = await stub.Fetch(fetch_request(wait_ms=20))
        found = [a.result for a in response.acks.answers if a.seq == seq]
        if found:
            return found[0]
    raise AssertionError(f"no answer to ack_seq {seq}")


def test_a_fetch_applies_the_acks_it_carries_and_a_response_answers_them_once() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        delivered(sc, 0, range(3))
        sc.buffer(0, range(3, 5))
        carried = [range_ack(0, 0, 3, 2), range_ack(0, 0, 3, 1)]  # the second: stale
        response = await stub.Fetch(fetch_request(ack_ranges=carried, ack_seq=7))
        assert [r.offset for r in response.records] == [3, 4]  # taken after the acks
        assert response.acks.applied_seq == 7
        answers = [a for a in response.acks.answers if a.seq == 7]
        result = answers[0].result if answers else await answer_of(stub, 7)
        assert result.acked_count == 1
        assert [r.reason for r in result.rejected_ranges] == [stream_pb2.REJECT_REASON_STALE_EPOCH]
        assert part.committed == 3  # committed before it was answered
        # Answered once; a fetch carrying nothing and with nothing to answer says nothing.
        assert not (await stub.Fetch(fetch_request())).HasField("acks")

    run(body)


def test_a_fetch_whose_carried_acks_cannot_be_committed_still_delivers() -> None:
    """Kafka refusing the commit refuses the carried ranges in the answer (COMMIT_FAILED),
    not the fetch: its records come; the acks stay recorded and the next commit makes them
    durable."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        delivered(sc, 0, range(3))
        sc.buffer(0, range(3, 5))
        sc.fetcher.fail = transport_error()
        request = fetch_request(ack_ranges=[range_ack(0, 0, 3, 2)], ack_seq=1)
        response = await stub.Fetch(request)
        assert [r.offset for r in response.records] == [3, 4]
        answers = [a.result for a in response.acks.answers]
        result = answers[0] if answers else await answer_of(stub, 1)
        assert result.acked_count == 0
        assert [r.reason for r in result.rejected_ranges] == [
            stream_pb2.REJECT_REASON_COMMIT_FAILED
        ]
        assert part.acks.commit_point == 3 and part.committed == 0
        sc.fetcher.fail = None
        retry = await stub.Ack(
            stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(0, 0, 5, 2)])
        )
        assert retry.acked_count == 1 and part.committed == 5

    run(body)


def test_a_fetch_carrying_a_malformed_ack_takes_nothing() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=2)
        sc.buffer(0, range(3))
        bad = fetch_request(ack_ranges=[range_ack(0, 2, 1, 2)], ack_seq=1)
        invalid_field(await failure(stub.Fetch(bad)), "ack_ranges.to_offset")
        unnumbered = fetch_request(ack_ranges=[range_ack(0, 0, 1, 2)])
        invalid_field(await failure(stub.Fetch(unnumbered)), "ack_seq")
        assert [r.offset for r in (await stub.Fetch(fetch_request())).records] == [0, 1, 2]

    run(body)


def test_fetch_auto_ack_loses_nothing_when_its_commit_fails() -> None:
    """auto_ack commits only what was written to the client: a commit that fails (Kafka
    down) neither fails the Fetch nor loses its records; the next commit covers them."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=4)
        sc.buffer(0, range(3))
        sc.fetcher.fail = transport_error()  # Kafka refuses commits for now
        received: list[int] = []
        try:
            response = await stub.Fetch(fetch_request(auto_ack=True))
            received += [r.offset for r in response.records]
        except grpc.aio.AioRpcError as err:
            print("the auto_ack Fetch failed:", err.code().name, err.details())
        sc.fetcher.fail = None
        sc.buffer(0, range(3, 5))
        deadline = time.monotonic() + 5
        while len(received) < 5 and time.monotonic() < deadline:
            response = await stub.Fetch(fetch_request(wait_ms=100, auto_ack=True))
            received += [r.offset for r in response.records]
        deadline = time.monotonic() + 5
        while part.acks.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # acked once the sidecar saw the response go out
        await sc.keeper.committer.commit_all()  # the commit loop's next round
        assert sorted(received) == [0, 1, 2, 3, 4], "every record reached the client"
        last = sc.fetcher.commits[-1]
        assert (last.offset, last.epoch, part.acks.inflight) == (5, 4, 0)

    run(body)


# ---- Ack ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "field_name"),
    [
        ({"client_id": "", "acks": [stream_pb2.RecordAck(topic=TOPIC)]}, "client_id"),
        ({"group": "", "acks": [stream_pb2.RecordAck(topic=TOPIC)]}, "group"),
        ({"acks": [stream_pb2.RecordAck(topic=TOPIC, offset=-1)]}, "acks.offset"),
        ({"ranges": [range_ack(-1, 0, 1, 1)]}, "ranges.partition"),
        ({"ranges": [range_ack(0, 4, 3, 1)]}, "ranges.to_offset"),
        ({"acks": [stream_pb2.RecordAck(topic=TOPIC)] * (MAX_ACKS + 1)}, "acks"),
    ],
)
def test_ack_validation_of_caller_records_and_ranges(
    request_fields: dict[str, Any], field_name: str
) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        fields: dict[str, Any] = {"client_id": "c", "group": GROUP, **request_fields}
        invalid_field(await failure(stub.Ack(stream_pb2.AckRequest(**fields))), field_name)

    run(body)


# ---- Nack -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "field_name"),
    [
        ({"client_id": "", "all": True}, "client_id"),
        ({"group": "", "all": True}, "group"),
        ({}, "records"),
        ({"records": [stream_pb2.RecordAck(topic="")]}, "records.topic"),
        ({"records": [stream_pb2.RecordAck(topic=TOPIC, partition=-1)]}, "records.partition"),
        ({"ranges": [range_ack(0, 4, 4, 1)]}, "ranges.to_offset"),
        ({"ranges": [range_ack(0, 0, 1, 1)] * (MAX_ACKS + 1)}, "ranges"),
        ({"all": True, "delay": duration_pb2.Duration(seconds=-1)}, "delay"),
        ({"all": True, "delay": duration_pb2.Duration(seconds=12 * 3600 + 1)}, "delay"),
        # Found by tests/fuzz: out of Duration's range, ToTimedelta() raised OverflowError
        # and the caller got UNKNOWN.
        (
            {"all": True, "delay": duration_pb2.Duration(seconds=-(2**63), nanos=-(2**31))},
            "delay",
        ),
        ({"all": True, "delay": duration_pb2.Duration(seconds=2**63 - 1)}, "delay"),
    ],
)
def test_nack_validation_of_caller_records_ranges_and_delay(
    request_fields: dict[str, Any], field_name: str
) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        fields: dict[str, Any] = {"client_id": "c", "group": GROUP, **request_fields}
        invalid_field(await failure(stub.Nack(stream_pb2.NackRequest(**fields))), field_name)

    run(body)


def test_nack_of_records_not_held_or_never_delivered_is_refused_per_record() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=2)
        delivered(sc, 0, range(3))
        request = stream_pb2.NackRequest(
            client_id="c",
            group=GROUP,
            ranges=[range_ack(0, 0, 9, 2), range_ack(7, 0, 1, 2), range_ack(0, 0, 1, 1)],
        )
        response = await stub.Nack(request)
        assert response.nacked_count == 0 and response.records == 0
        assert [r.reason for r in response.rejected_ranges] == [
            stream_pb2.REJECT_REASON_NOT_DELIVERED,
            stream_pb2.REJECT_REASON_NOT_HELD,
            stream_pb2.REJECT_REASON_STALE_EPOCH,
        ]
        other = stream_pb2.NackRequest(client_id="x", group="other", all=True)
        code, reason, _ = await failure(stub.Nack(other))
        assert (code, reason) == NOT_SERVED

    run(body)


def test_ack_for_another_group_is_not_served() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        ack = stream_pb2.RecordAck(topic=TOPIC, partition=0, offset=0, lease_epoch=1)
        request = stream_pb2.AckRequest(client_id="c", group="other", acks=[ack])
        code, reason, metadata = await failure(stub.Ack(request))
        assert (code, reason, metadata["served_group"]) == (*NOT_SERVED, GROUP)

    run(body)


def test_ack_whose_commit_fails_is_unavailable_and_can_be_retried() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        records = delivered(sc, 0, range(3))
        sc.fetcher.fail = transport_error()
        request = stream_pb2.AckRequest(client_id="c", group=GROUP, acks=acks_of(records))
        assert (await failure(stub.Ack(request)))[:2] == KAFKA_DOWN
        assert part.acks.commit_point == 3 and part.committed == 0  # recorded, not committed
        sc.fetcher.fail = None
        response = await stub.Ack(request)  # the retry: acked already, committed now
        assert response.acked_count == 3 and part.committed == 3

    run(body)


def test_an_ack_is_not_answered_accepted_when_the_lease_lapsed_before_its_commit() -> None:
    """An accepted ack is committed before it is answered: an ack that reaches a partition
    whose local lease deadline has passed cannot be committed, so it is refused (the
    records are redelivered by whoever holds the partition next)."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        delivered(sc, 0, range(4))
        part.deadline = time.monotonic() - 0.01  # passed; the commit loop has not looked yet
        request = stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(0, 0, 4, 2)])
        response = await stub.Ack(request)
        assert response.acked_count == 0, "answered accepted, but nothing was committed"
        assert [r.reason for r in response.rejected_ranges] == [
            stream_pb2.REJECT_REASON_LEASE_EXPIRED
        ]
        assert sc.fetcher.commits == []

    run(body)


def test_an_ack_whose_commit_the_fetch_thread_dropped_is_not_answered_accepted() -> None:
    """The fetch thread drops a commit whose lease lapsed while it waited for its turn
    (``Fetcher.commit``): the acks it carried were not made durable and are refused."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=2)
        delivered(sc, 0, range(4))
        sc.fetcher.drop = True
        request = stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(0, 0, 4, 2)])
        response = await stub.Ack(request)
        assert response.acked_count == 0, "answered accepted, but nothing was committed"
        assert [r.reason for r in response.rejected_ranges] == [
            stream_pb2.REJECT_REASON_COMMIT_FAILED
        ]

    run(body)


def test_an_ack_during_a_revokes_drain_is_committed_before_it_is_answered() -> None:
    """The compose sidecar-kill finding (records acked under epoch 2 delivered again under
    epoch 3): while a revoke drains, the partition still takes acks (the drain waits for
    them), so an ack answered accepted then must already be committed, not left to the
    final commit that a SIGKILL during the drain never makes."""

    async def body(stub: Stub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=2)
        delivered(sc, 0, range(4))
        part.revoking = True  # LeaseKeeper.revoke: the drain is under way
        request = stream_pb2.AckRequest(client_id="c", group=GROUP, ranges=[range_ack(0, 0, 4, 2)])
        response = await stub.Ack(request)
        assert response.acked_count == 1 and not response.rejected_ranges
        assert [(c.offset, c.epoch) for c in sc.fetcher.commits] == [(4, 2)], (
            "answered accepted, but nothing was committed"
        )

    run(body)


# ---- Stream ---------------------------------------------------------------------------


def test_stream_open_validation() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        bad_format = opening(records=1)
        bad_format.open.format = 9
        invalid_field(await failure(stub.Stream(Requests(bad_format))), "open.format")
        invalid_field(
            await failure(stub.Stream(Requests(opening(nbytes=-1)))), "open.initial_credit.bytes"
        )
        for seconds, nanos in ((2, 0), (0, -1)):  # over 1 s; negative
            lingering = opening(records=1)
            lingering.open.linger.CopyFrom(duration_pb2.Duration(seconds=seconds, nanos=nanos))
            invalid_field(await failure(stub.Stream(Requests(lingering))), "open.linger")

    run(body)


@pytest.mark.parametrize(
    ("later", "field_name"),
    [
        (stream_pb2.StreamRequest(), "kind"),
        (stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=-1)), "credit.records"),
        (
            stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(ranges=[range_ack(0, 5, 5, 1)])),
            "acks.ranges.to_offset",
        ),
        (
            stream_pb2.StreamRequest(
                acks=stream_pb2.StreamAcks(acks=[stream_pb2.RecordAck(partition=0)])
            ),
            "acks.acks.topic",
        ),
        (
            stream_pb2.StreamRequest(nacks=stream_pb2.StreamNacks(ranges=[range_ack(0, 5, 4, 1)])),
            "nacks.ranges.to_offset",
        ),
        (
            stream_pb2.StreamRequest(
                nacks=stream_pb2.StreamNacks(records=[stream_pb2.RecordAck(topic=TOPIC, offset=-1)])
            ),
            "nacks.records.offset",
        ),
        (
            stream_pb2.StreamRequest(
                nacks=stream_pb2.StreamNacks(delay=duration_pb2.Duration(seconds=-1))
            ),
            "nacks.delay",
        ),
    ],
)
def test_stream_later_message_validation(later: stream_pb2.StreamRequest, field_name: str) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        invalid_field(await failure(stub.Stream(Requests(opening(), later))), field_name)

    run(body)


def test_stream_stale_acks_are_answered_per_record_not_by_ending_the_stream() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=6)
        records = delivered(sc, 0, range(2))
        stale = stream_pb2.StreamAcks(acks=acks_of(records, epoch=5))
        requests = Requests(opening(), stream_pb2.StreamRequest(acks=stale))
        call = stub.Stream(requests)
        result = (await call.read()).ack_result
        assert result.acked_count == 0
        assert [r.reason for r in result.rejected_acks] == [
            stream_pb2.REJECT_REASON_STALE_EPOCH
        ] * 2
        requests.send(None)
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

    run(body)


def test_stream_ack_whose_commit_fails_ends_the_stream_unavailable() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        records = delivered(sc, 0, range(2))
        sc.fetcher.fail = transport_error()
        acks = stream_pb2.StreamAcks(acks=acks_of(records))
        call = stub.Stream(Requests(opening(), stream_pb2.StreamRequest(acks=acks)))
        assert (await failure(call))[:2] == KAFKA_DOWN

    run(body)


# ---- ReadRange ------------------------------------------------------------------------


def test_read_range_caller_and_format_validation() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        invalid_field(await failure(read_all(stub, read_request(group=""))), "group")
        invalid_field(await failure(read_all(stub, read_request(format=9))), "format")
        code, reason, metadata = await failure(read_all(stub, read_request(group="other")))
        assert (code, reason, metadata["served_group"]) == (*NOT_SERVED, GROUP)

    run(body)


@pytest.mark.parametrize(
    ("error", "code", "reason", "metadata"),
    [
        (
            RangeOutOfRange(5, 8),
            grpc.StatusCode.OUT_OF_RANGE,
            "OFFSET_OUT_OF_RANGE",
            {
                "topic": TOPIC,
                "partition": "0",
                "from_offset": "0",
                "to_offset": "10",
                "log_start_offset": "5",
                "high_watermark": "8",
            },
        ),
        (
            KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
            grpc.StatusCode.NOT_FOUND,
            "TOPIC_NOT_FOUND",
            {"topic": TOPIC, "partition": "0"},
        ),
        (transport_error(), *KAFKA_DOWN, {}),
    ],
)
def test_read_range_maps_kafka_failures(
    error: Exception, code: grpc.StatusCode, reason: str, metadata: dict[str, str]
) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        assert await failure(read_all(stub, read_request())) == (code, reason, metadata)

    run(body, readers=FakeReaders(fail=error))


def stall(index: int) -> None:
    raise ReadStalled("no progress from Kafka for 30 s")


def test_read_range_stalled_or_stopped_is_unavailable() -> None:
    async def stalled(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        assert (await failure(read_all(stub, read_request())))[:2] == KAFKA_DOWN

    run(stalled, readers=FakeReaders(before_chunk=stall))
    # The read ends (None) before the range's end: the reader was stopped.
    short = [Chunk([common_pb2.Record(topic=TOPIC, offset=0)], next_offset=1)]

    async def stopped(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        responses = stub.ReadRange(read_request())
        assert (await responses.read()).next_offset == 1
        assert (await failure(responses))[:2] == NOT_READY

    run(stopped, readers=FakeReaders(chunks=short))


def test_read_range_stops_when_the_lease_moves_under_it() -> None:
    chunks = [
        Chunk([common_pb2.Record(topic=TOPIC, offset=o) for o in (0, 1)], next_offset=2),
        Chunk([common_pb2.Record(topic=TOPIC, offset=o) for o in (2, 3)], next_offset=4),
    ]
    held: list[Any] = []

    def regrant(index: int) -> None:
        if index == 1:  # after the first chunk: the partition was granted again elsewhere
            held[0].epoch = 10

    async def body(stub: Stub, sc: Sidecar) -> None:
        held.append(sc.hold(0, epoch=9))
        responses = stub.ReadRange(read_request())
        first = await responses.read()
        assert (first.lease_epoch, first.next_offset) == (9, 2)
        code, reason, metadata = await failure(responses)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_NOT_HELD")
        assert (metadata["state"], metadata["current_epoch"]) == ("STALE_EPOCH", "10")

    run(body, readers=FakeReaders(chunks=chunks, before_chunk=regrant))


# ---- CommitOffsets --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offsets", "field_name"),
    [
        ([stream_pb2.OffsetCommit(partition=0, offset=1, lease_epoch=1)], "offsets.topic"),
        ([commit(-1, 1, 1)], "offsets.partition"),
        ([commit(0, 1, -1)], "offsets.lease_epoch"),
        ([commit(p, 1, 1) for p in range(MAX_COMMITS + 1)], "offsets"),
    ],
)
def test_commit_offsets_validation_of_each_offset(
    offsets: list[stream_pb2.OffsetCommit], field_name: str
) -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        request = stream_pb2.CommitOffsetsRequest(client_id="s", group=GROUP, offsets=offsets)
        invalid_field(await failure(stub.CommitOffsets(request)), field_name)

    run(body)


def test_commit_offsets_refused_by_kafka_is_per_partition() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0, epoch=3)
        sc.serving.range_given(TP(TOPIC, 0), 3, "s", 0, 5)  # what ReadRange gave the client
        sc.fetcher.fail = transport_error()
        request = stream_pb2.CommitOffsetsRequest(
            client_id="s", group=GROUP, offsets=[commit(0, 5, 3)]
        )
        (result,) = (await stub.CommitOffsets(request)).results
        assert not result.committed
        assert result.reason == stream_pb2.REJECT_REASON_COMMIT_FAILED

    run(body)


# ---- Status ---------------------------------------------------------------------------


def test_status_reports_the_served_view() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(1, epoch=7)
        sc.hold(0, epoch=3, start=10)
        sc.buffer(0, range(10, 14))
        status = await stub.Status(stream_pb2.StatusRequest())
        assert (status.sidecar_id, status.group, status.assigner_connected) == ("sc-1", GROUP, True)
        assert [(p.partition, p.lease_epoch, p.buffered_records) for p in status.partitions] == [
            (0, 3, 4),
            (1, 7, 0),
        ]
        assert status.partitions[0].position == 14 and status.partitions[0].committed_offset == 10
        assert status.buffer_bytes == sc.table.buffered_bytes > 0
        assert status.buffer_cap_bytes == sc.table.buffer_max_bytes
        assert dict(status.consumer_config) == CONSUMER_CONFIG
        sc.connected = False
        assert not (await stub.Status(stream_pb2.StatusRequest())).assigner_connected

    run(body)
