"""Stream on the sidecar's frame socket (``StreamOpen.frame_socket``, frame_socket.py)
through an in-process gRPC server on a Unix socket (stream_harness.py): the call opens the
stream and names the socket; batches, acks, nacks and their answers go as frames; the
socket's end is the stream's end (what was not acked comes again); and what cannot work
is refused with the field that says why (TCP, a socket never connected, a frame that is
not a request, a message on the call instead of the socket)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import grpc
import grpc.aio
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import local_socket
from dsclient.records.batches import decode_batch
from dsclient.shared import Segments
from services.consumer_sidecar import frame_socket
from services.consumer_sidecar.client_access import ClientIdLimiter, ClientMetrics
from services.consumer_sidecar.shm_delivery import SharedMemory
from tests.unit.sidecar.stream_harness import (
    Requests,
    Sidecar,
    opening,
    range_ack,
    reason_of,
    run,
)

HEADER = struct.Struct("<I")
OPEN_AGAIN = stream_pb2.StreamRequest(
    open=stream_pb2.StreamOpen(client_id="c1")
).SerializeToString()


class Frames:
    """The client's end of a stream's frame socket, as a test drives it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, directory: Path, named: stream_pb2.FrameSocket) -> Frames:
        reader, writer = await asyncio.open_unix_connection(str(directory / named.name))
        frames = cls(reader, writer)
        frames.raw(named.token)
        return frames

    def raw(self, data: bytes) -> None:
        self.writer.write(HEADER.pack(len(data)) + data)

    def send(self, request: stream_pb2.StreamRequest) -> None:
        self.raw(request.SerializeToString())

    async def read(self) -> stream_pb2.StreamResponse | None:
        """The next response, None at the socket's end."""
        try:
            (size,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
            return stream_pb2.StreamResponse.FromString(await self.reader.readexactly(size))
        except asyncio.IncompleteReadError:
            return None

    def close(self) -> None:
        self.writer.close()


async def opened(
    stub: stream_pb2_grpc.StreamServiceStub, directory: Path, **kw: object
) -> tuple[Requests, grpc.aio.StreamStreamCall, Frames]:  # type: ignore[type-arg]
    requests = Requests(opening(frame_socket=True, **kw))  # type: ignore[arg-type]
    call = stub.Stream(requests)
    first = await call.read()
    assert first.WhichOneof("kind") == "frame_socket"
    assert first.frame_socket.name == local_socket.frame_socket_name("sc-1")
    assert len(first.frame_socket.token) == frame_socket.TOKEN_BYTES
    return requests, call, await Frames.connect(directory, first.frame_socket)


def offsets_of(response: stream_pb2.StreamResponse) -> list[int]:
    assert response.WhichOneof("kind") == "batch", response
    return [r.offset for r in response.batch.records]


def test_batches_acks_nacks_and_answers_go_as_frames(tmp_path: Path) -> None:
    clients = ClientMetrics("g", ClientIdLimiter(10, 60))

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=4)
        sc.buffer(0, range(10))
        _requests, call, frames = await opened(stub, tmp_path, records=100)
        got: list[int] = []
        while len(got) < 10:
            response = await frames.read()
            assert response is not None
            got += offsets_of(response)
        assert got == list(range(10))
        assert frame_streams(clients) == 1
        frames.send(
            stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(ranges=[range_ack(0, 0, 6, 4)]))
        )
        answer = await frames.read()
        assert answer is not None and answer.ack_result.acked_count == 1
        assert part.acks.commit_point == 6 and sc.fetcher.commits  # committed before the answer
        nacks = stream_pb2.StreamNacks(ranges=[range_ack(0, 6, 8, 4)])
        frames.send(stream_pb2.StreamRequest(nacks=nacks))
        nacked = await frames.read()
        assert nacked is not None and nacked.nack_result.nacked_count == 1
        again = await frames.read()  # nacked without a delay: delivered again at once
        assert again is not None and offsets_of(again) == [6, 7]
        # A stale epoch is refused on the frame socket as on the call.
        stale = stream_pb2.StreamAcks(ranges=[range_ack(0, 6, 10, 3)])
        frames.send(stream_pb2.StreamRequest(acks=stale))
        refused = await frames.read()
        assert refused is not None and len(refused.ack_result.rejected_ranges) == 1
        assert part.acks.commit_point == 6
        # The client closes its socket: the stream ends, the call with it, and 6..9 (not
        # acked) come again to the next stream.
        frames.close()
        assert await call.read() == grpc.aio.EOF
        assert frame_streams(clients) == 0
        plain = stub.Stream(Requests(opening(records=100)))
        response = await plain.read()
        assert offsets_of(response) == [6, 7, 8, 9]
        plain.cancel()

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True, clients=clients)


def frame_streams(clients: ClientMetrics) -> float:
    return sum(
        s.value
        for metric in clients.collect()
        for s in metric.samples
        if s.name == "ds_client_frame_streams"
    )


def test_arrow_shm_runs_are_announced_and_released_on_the_frame_socket(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0)
        sc.buffer(0, range(20))
        _requests, call, frames = await opened(
            stub, tmp_path, records=100, format=stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        )
        mapped = Segments(tmp_path)
        rows: list[int] = []
        shared: list[stream_pb2.SharedBatch] = []
        while len(rows) < 20:
            response = await frames.read()
            assert response is not None and not response.batch.records
            for run_ in response.batch.shared:
                rows += mapped.read(run_).column("offset").to_pylist()
                shared.append(run_)
        assert rows == list(range(20))
        acks = stream_pb2.StreamAcks(
            ranges=[range_ack(0, s.first_offset, s.last_offset + 1, s.lease_epoch) for s in shared],
            released=[s.region for s in shared],
        )
        frames.send(stream_pb2.StreamRequest(acks=acks))
        answer = await frames.read()
        assert answer is not None and answer.ack_result.acked_count == len(shared)
        assert part.acks.commit_point == 20
        frames.close()
        assert await call.read() == grpc.aio.EOF

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


def test_the_frame_socket_is_refused_over_tcp() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        call = stub.Stream(Requests(opening(records=10, frame_socket=True)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, _reason, metadata = reason_of(err.value)
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "open.frame_socket")

    run(body)


def test_a_frame_socket_never_connected_fails_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_socket, "ATTACH_SECONDS", 0.3)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(3))
        call = stub.Stream(Requests(opening(records=10, frame_socket=True)))
        first = await call.read()
        # A connection with another token is closed; the stream still waits for its own.
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / first.frame_socket.name))
        writer.write(HEADER.pack(16) + bytes(16))
        assert await reader.read() == b""
        writer.close()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, _reason, metadata = reason_of(err.value)
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "open.frame_socket")
        # Nothing was delivered: the records go to the next stream.
        plain = stub.Stream(Requests(opening(records=10)))
        assert offsets_of(await plain.read()) == [0, 1, 2]
        plain.cancel()

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (HEADER.pack(3) + b"\xff\xff\xff", "frame"),  # not a StreamRequest
        (HEADER.pack(frame_socket.MAX_REQUEST_BYTES + 1), "frame"),  # too large
        (HEADER.pack(len(OPEN_AGAIN)) + OPEN_AGAIN, "open"),  # opened twice
    ],
    ids=["garbage", "too-large", "open-again"],
)
def test_a_bad_frame_fails_the_stream_with_the_field(
    tmp_path: Path, frame: bytes, field: str
) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        _requests, call, frames = await opened(stub, tmp_path, records=10)
        frames.writer.write(frame)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while True:
                await call.read()
        code, _reason, metadata = reason_of(err.value)
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, field)
        assert await frames.read() is None  # the socket was closed with the stream

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


def test_a_message_on_the_call_instead_of_the_socket_fails_the_stream(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        requests, call, _frames = await opened(stub, tmp_path, records=10)
        requests.send(stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=5)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, _reason, metadata = reason_of(err.value)
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "credit")

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


def test_a_client_that_half_closes_the_call_ends_the_stream(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        requests, call, frames = await opened(stub, tmp_path, records=10)
        requests.send(None)
        assert await call.read() == grpc.aio.EOF
        assert await frames.read() is None

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


def test_a_records_batch_decodes_from_its_frame(tmp_path: Path) -> None:
    """A BATCHES stream's responses are wire bytes written straight from the chunks: the
    frame carries them unchanged."""

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(1)
        sc.buffer(1, range(5))
        _requests, call, frames = await opened(
            stub, tmp_path, records=10, format=stream_pb2.DELIVERY_FORMAT_BATCHES
        )
        response = await frames.read()
        assert response is not None
        assert [r.offset for b in response.batch.batches for r in decode_batch(b)] == list(range(5))
        frames.close()
        assert await call.read() == grpc.aio.EOF

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)


def test_a_frame_socket_that_cannot_be_served_is_refused_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its path too long for a socket (the gRPC socket's name is two bytes shorter), say:
    the stream is refused on open.frame_socket, so the client opens without it, instead of
    failing with an internal error the client would hand to the application."""

    claim = local_socket.claim

    def too_long(path: Path) -> None:
        if path.name.endswith(".frames"):
            raise OSError(f"socket path {path} is longer than 107 bytes")
        claim(path)

    monkeypatch.setattr(local_socket, "claim", too_long)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(2))
        call = stub.Stream(Requests(opening(records=10, frame_socket=True)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, _reason, metadata = reason_of(err.value)
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "open.frame_socket")
        assert "longer than 107 bytes" in (err.value.details() or "")
        plain = stub.Stream(Requests(opening(records=10)))
        assert offsets_of(await plain.read()) == [0, 1]
        plain.cancel()

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), frames=True)
