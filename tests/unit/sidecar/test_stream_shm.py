"""Stream's DELIVERY_FORMAT_ARROW_SHM through an in-process gRPC server on a Unix socket
(stream_harness.py): each partition run written once into the stream's segment and read in
place, the segment's room given back by releases, the file gone once mapped or when the
stream ends, and the format refused where it cannot work (TCP, Fetch)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import local_socket
from dsclient.records.batches import chunk_from_records, decode_batch
from dsclient.shared import Segments
from services.consumer_sidecar.client_access import ClientIdLimiter, ClientMetrics
from services.consumer_sidecar.shm_delivery import SharedMemory
from tests.unit.sidecar.stream_harness import (
    TOPIC,
    Requests,
    Sidecar,
    fetch_request,
    opening,
    range_ack,
    reason_of,
    run,
)

SHM = stream_pb2.DELIVERY_FORMAT_ARROW_SHM


def released(
    *regions: int, ranges: list[stream_pb2.RangeAck] | None = None
) -> stream_pb2.StreamRequest:
    return stream_pb2.StreamRequest(
        acks=stream_pb2.StreamAcks(ranges=ranges or [], released=list(regions))
    )


def decode_offsets(batch: stream_pb2.RecordBatch) -> list[int]:
    return [r.offset for r in decode_batch(batch)]


def segment_files(directory: Path) -> list[str]:
    prefix = local_socket.segment_prefix("sc-1")
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(prefix))


def test_each_run_is_written_once_and_read_in_place(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        parts = {0: sc.hold(0, epoch=3), 1: sc.hold(1, epoch=5)}
        sc.buffer(0, range(10))
        sc.buffer(1, range(4))
        requests = Requests(opening(records=100, format=SHM))
        call = stub.Stream(requests)
        mapped = Segments(tmp_path)  # the client's reader: schema and rows checked
        got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        sent: list[stream_pb2.SharedBatch] = []
        while sum(map(len, got.values())) < 14:
            response = await call.read()
            assert response.WhichOneof("kind") == "batch"
            assert not response.batch.records and not response.batch.batches
            for shared in response.batch.shared:
                rows = mapped.read(shared)
                assert shared.topic == TOPIC and shared.record_count == rows.num_rows
                assert shared.lease_epoch == parts[shared.partition].epoch
                offsets = rows.column("offset").to_pylist()
                assert (offsets[0], offsets[-1]) == (shared.first_offset, shared.last_offset)
                got[shared.partition] += zip(offsets, rows.column("value").to_pylist(), strict=True)
                sent.append(shared)
        assert got[0] == [(o, b"v%d" % o) for o in range(10)]
        assert got[1] == [(o, b"v%d" % o) for o in range(4)]
        assert segment_files(tmp_path) == [sent[0].segment]  # until the client has it mapped
        ranges = [
            range_ack(s.partition, s.first_offset, s.last_offset + 1, s.lease_epoch) for s in sent
        ]
        requests.send(released(*(s.region for s in sent), ranges=ranges))
        result = await call.read()
        assert result.ack_result.acked_count == len(sent) and not result.ack_result.rejected_ranges
        assert parts[0].acks.commit_point == 10 and parts[1].acks.commit_point == 4
        assert segment_files(tmp_path) == []  # released once: the client has it mapped
        requests.send(None)
        assert await call.read() == grpc.aio.EOF

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20))


def test_a_full_segment_waits_for_releases_and_nothing_is_lost(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0)
        requests = Requests(opening(records=100_000, format=SHM))
        call = stub.Stream(requests)
        mapped = Segments(tmp_path)  # the client's reader: schema and rows checked
        offsets: list[int] = []
        reading = asyncio.ensure_future(call.read())  # a read cancelled would end the call
        held: list[stream_pb2.SharedBatch] = []
        waits = 0
        for round_ in range(6):  # together several times what the segment holds
            sc.buffer(0, range(round_ * 200, (round_ + 1) * 200))
            while len(offsets) < (round_ + 1) * 200:
                done, _ = await asyncio.wait([reading], timeout=0.8)
                if not done:
                    # The segment is full of what this side holds: release it all.
                    assert held, "nothing held, yet nothing arrives"
                    requests.send(released(*(s.region for s in held)))
                    held, waits = [], waits + 1
                    continue
                response, reading = reading.result(), asyncio.ensure_future(call.read())
                if response.WhichOneof("kind") != "batch":
                    continue
                assert not response.batch.batches  # every run fits the segment
                for shared in response.batch.shared:
                    offsets += mapped.read(shared).column("offset").to_pylist()
                    held.append(shared)
        assert waits >= 2  # the segment was full, and room came back with the releases
        assert offsets == list(range(1200))  # in order, each once
        assert part.acks.inflight == 1200
        reading.cancel()
        call.cancel()

    # A run of 200 short records is about 9 KiB of Arrow: 24 KiB holds two.
    run(body, shared_memory=SharedMemory(tmp_path, 24 * 1024))


def test_a_run_larger_than_the_segment_comes_as_a_record_batch(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(50))
        call = stub.Stream(Requests(opening(records=100, format=SHM)))
        offsets: list[int] = []
        while len(offsets) < 50:
            response = await call.read()
            assert not response.batch.shared  # not even one record's stream fits
            for batch in response.batch.batches:
                offsets += decode_offsets(batch)
        assert offsets == list(range(50))
        call.cancel()

    run(body, shared_memory=SharedMemory(tmp_path, 512))


def test_the_segment_goes_when_the_stream_ends_and_its_records_come_again(
    tmp_path: Path,
) -> None:
    clients = ClientMetrics("g", ClientIdLimiter(10, 60))

    def shared_bytes() -> list[float]:
        return [
            sample.value
            for family in clients.collect()
            for sample in family.samples
            if sample.name == "ds_client_shared_memory_bytes"
        ]

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0)
        sc.buffer(0, range(5))
        call = stub.Stream(Requests(opening(records=100, format=SHM)))
        response = await call.read()
        assert response.batch.shared and segment_files(tmp_path)
        assert shared_bytes() == [1 << 20]  # the client's open stream holds a segment
        call.cancel()
        for _ in range(100):
            if not segment_files(tmp_path) and part.acks.inflight == 0:
                break
            await asyncio.sleep(0.02)
        assert segment_files(tmp_path) == []
        assert part.acks.inflight == 0 and part.acks.due == 5  # delivered again, not lost
        assert shared_bytes() == [0]

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20), clients=clients)


def test_arrow_shm_is_refused_over_tcp() -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        call = stub.Stream(Requests(opening(records=10, format=SHM)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, reason, metadata = reason_of(err.value)
        assert (code, reason, metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "open.format",
        )

    run(body)


def test_arrow_shm_is_refused_on_fetch(tmp_path: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Fetch(fetch_request(format=SHM))
        code, reason, metadata = reason_of(err.value)
        assert (code, reason, metadata["field"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            "format",
        )

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20))


def test_a_restarted_sidecar_sweeps_only_its_own_stale_segments(tmp_path: Path) -> None:
    mine = tmp_path / f"{local_socket.segment_prefix('sc-1')}abc"
    other = tmp_path / f"{local_socket.segment_prefix('sc-10')}abc"
    mine.write_bytes(b"x")
    other.write_bytes(b"x")
    assert local_socket.sweep_segments(tmp_path, "sc-1") == 1
    assert not mine.exists() and other.exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB memory volume, as a pod's ``emptyDir`` at its sizeLimit (root only)."""
    mount_point = tmp_path / "volume"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_full_memory_volume_refuses_the_stream_instead_of_a_sigbus(small_tmpfs: Path) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(5))
        call = stub.Stream(Requests(opening(records=10, format=SHM)))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        code, reason, _ = reason_of(err.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")
        assert segment_files(small_tmpfs) == []  # nothing left behind

    # A 4 MiB segment in a 1 MiB volume: allocated whole at open, so refused there.
    run(body, shared_memory=SharedMemory(small_tmpfs, 4 << 20))


def test_a_run_too_large_for_the_segment_ends_its_response(tmp_path: Path) -> None:
    """A client hands out a response's shared runs, then its RecordBatches: a run that goes
    as a RecordBatch is the last of its response, so a partition's records stay in order."""
    from services.consumer_sidecar.shm_delivery import shared_response
    from services.consumer_sidecar.shm_segment import Segment
    from services.consumer_sidecar.stream_flow import Credit, StreamState

    chunks = []
    for offsets, size in ((range(0, 5), 3), (range(5, 6), 6000), (range(6, 11), 3)):
        records = [
            common_pb2.Record(topic=TOPIC, partition=0, offset=o, value=b"v" * size)
            for o in offsets
        ]
        chunks.append(chunk_from_records(records))
    state = StreamState(credit=Credit(), auto_ack=False, columns=False)
    state.segment = Segment(tmp_path, "sc-1", 6 * 1024)  # the 6000-byte run does not fit
    state.pending = [chunk.take(len(chunk), TOPIC, 0, 1) for chunk in chunks]
    first, sent = shared_response(state)
    assert [s.first_offset for s in first.batch.shared] == [0]
    assert [decode_offsets(b) for b in first.batch.batches] == [[5]]
    assert len(sent) == 2 and len(state.pending) == 1  # the run after it waits
    second, _ = shared_response(state)
    assert [(s.first_offset, s.last_offset) for s in second.batch.shared] == [(6, 10)]
    assert not second.batch.batches and not state.pending
    state.segment.close()


@pytest.fixture
def slow_fallocate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Segment creation that takes until the returned event is set (a big segment on a
    busy node: allocating every page of 32 MiB takes 4-12 ms here, at best)."""
    from services.consumer_sidecar import shm_segment

    release = threading.Event()
    real = os.posix_fallocate

    def fallocate(fd: int, offset: int, length: int) -> None:
        release.wait(10)
        real(fd, offset, length)

    monkeypatch.setattr(shm_segment.os, "posix_fallocate", fallocate)
    yield release
    release.set()


def test_making_a_segment_does_not_stop_the_other_calls(
    tmp_path: Path, slow_fallocate: threading.Event
) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(5))
        call = stub.Stream(Requests(opening(records=100, format=SHM)))
        await asyncio.sleep(0.2)  # the segment is being made
        # Another client's call is served meanwhile: the event loop is not held by it.
        fetched = await stub.Fetch(fetch_request(max_records=2), timeout=5)
        assert [r.offset for r in fetched.records] == [0, 1]
        slow_fallocate.set()
        response = await call.read()
        assert [s.first_offset for s in response.batch.shared] == [2]
        call.cancel()

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20))


def test_a_stream_gone_while_its_segment_is_made_leaves_no_file(
    tmp_path: Path, slow_fallocate: threading.Event
) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0)
        sc.buffer(0, range(5))
        call = stub.Stream(Requests(opening(records=100, format=SHM)))
        await asyncio.sleep(0.2)  # the segment is being made
        call.cancel()
        await asyncio.sleep(0.2)
        slow_fallocate.set()  # made after the stream went: closed at once
        for _ in range(100):
            if not segment_files(tmp_path):
                break
            await asyncio.sleep(0.02)
        assert segment_files(tmp_path) == []
        assert part.acks.inflight == 0 and part.acks.due == 0  # nothing was taken for it

    run(body, shared_memory=SharedMemory(tmp_path, 1 << 20))


def test_a_client_holding_its_whole_segment_takes_nothing_more(tmp_path: Path) -> None:
    """Records are taken for an ARROW_SHM stream only as its segment has room for them:
    what a client holding its segment full cannot be sent stays buffered, and another
    client reads it (taken and held back, it would wait out the visibility timeout)."""

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0)
        sc.buffer(0, range(600))
        holding = stub.Stream(Requests(opening(records=100_000, format=SHM)))
        mapped = Segments(tmp_path)
        held: list[int] = []
        reading = asyncio.ensure_future(holding.read())
        while True:  # what the segment holds; none of it is released
            done, _ = await asyncio.wait([reading], timeout=0.5)
            if not done:
                break
            for shared in reading.result().batch.shared:
                held += mapped.read(shared).column("offset").to_pylist()
            reading = asyncio.ensure_future(holding.read())
        assert 0 < len(held) < 600
        assert part.acks.inflight == len(held)  # nothing taken that was not written
        other = stub.Stream(Requests(opening(records=100_000, client_id="c2")))
        rest: list[int] = []
        while len(rest) < 600 - len(held):
            response = await asyncio.wait_for(other.read(), 5)
            rest += [r.offset for r in response.batch.records]
        assert sorted(held + rest) == list(range(600))
        reading.cancel()
        holding.cancel()
        other.cancel()

    # A run of 200 short records is about 9 KiB of Arrow.
    run(body, shared_memory=SharedMemory(tmp_path, 24 * 1024))
