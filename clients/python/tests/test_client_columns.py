"""DsClient.stream_columns (issue 22 item 1, the zero-copy mode's client): ColumnBatch and
its release bookkeeping (pure), a stream's segments mapped and read in place (a real file),
and the ``Stream`` protocol against scripted sidecars (clients/python/tests/scripted.py) on a
real Unix domain socket and on TCP: the format asked for, the regions released with the
acks on the stream that delivered them (and only its running opening), ``auto_ack``'s
release-only messages, and the fall back to BATCHES when a sidecar refuses ARROW_SHM."""

from __future__ import annotations

import logging
import queue
from array import array
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted import (
    TOPIC,
    Assigner,
    Servers,
    Sidecar,
    abort,
    binding,
    record_batch,
    wait_for,
)

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import DsClient
from dsclient.batch import Span
from dsclient.columns import (
    ColumnBatch,
    Release,
    by_stream,
    joined_columns,
    regions_of,
)
from dsclient.local_socket import sidecar_file_name, target
from dsclient.reasons import invalid
from dsclient.records import wire
from dsclient.records.arrow_batches import SCHEMA, from_message
from dsclient.shared import Segments, SharedBatchError
from dsclient.stream import columns_of, columns_of_batches, columns_of_fields

# ---- pure: ColumnBatch and releases --------------------------------------------------


def run(partition: int, offsets: range, epoch: int = 1) -> tuple[pa.RecordBatch, Span]:
    rb = record_batch(partition, offsets, epoch)
    span = Span(TOPIC, partition, epoch, offsets[0], offsets[-1] + 1, len(offsets))
    return from_message(rb), span


def test_a_column_batch_counts_its_runs_and_joins_them_without_a_copy() -> None:
    (b0, s0), (b1, s1) = run(0, range(3, 6)), run(1, range(10, 12))
    first = ColumnBatch([b0], [s0], [Release("s", 1, (7,))])
    second = ColumnBatch([b1], [s1], [Release("s", 1, (8, 9)), Release("t", 2, ())])
    both = joined_columns([first, second])
    assert len(both) == 5 and both and not ColumnBatch()
    assert both.spans == (s0, s1) and both.delivery_counts == (1, 1)
    assert both.releases == (Release("s", 1, (7,)), Release("s", 1, (8, 9)))  # empty dropped
    table = both.table
    assert table.schema.equals(SCHEMA) and table.num_rows == 5
    assert table.column("offset").to_pylist() == [3, 4, 5, 10, 11]
    # one chunk per run, pointing at the runs' own buffers
    assert table.column("value").num_chunks == 2
    assert table.column("value").chunk(0).buffers()[2].address == b0.column(1).buffers()[2].address
    assert ColumnBatch().table.num_rows == 0
    # copy(): every buffer the application's own (combine_chunks would keep a lone chunk)
    copied = first.copy()
    assert copied.equals(first.table)
    assert copied.column("value").chunk(0).buffers()[2].address != b0.column(1).buffers()[2].address
    with pytest.raises(ValueError):
        ColumnBatch([b0], [])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.integers(1, 3),
            st.lists(st.integers(0, 99), max_size=4),
        ),
        max_size=12,
    ),
    st.integers(1, 3),
)
def test_releases_reach_their_stream_and_only_its_running_generation(
    items: list[tuple[str, int, list[int]]], running: int
) -> None:
    releases = [Release(stream, gen, tuple(ids)) for stream, gen, ids in items]
    grouped = by_stream(releases)
    for stream in ("a", "b"):
        sent = regions_of(grouped.get(stream, {}), running)
        wanted = [i for s, g, ids in items if s == stream and g == running for i in ids]
        assert sent == wanted  # in the order given; other generations' ids dropped


# ---- a stream's segments, mapped -----------------------------------------------------


def ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def shared(
    segment: str, position: int, length: int, region: int, rows: int, partition: int = 0
) -> stream_pb2.SharedBatch:
    return stream_pb2.SharedBatch(
        topic=TOPIC,
        partition=partition,
        lease_epoch=1,
        delivery_count=1,
        first_offset=0,
        last_offset=rows - 1,
        record_count=rows,
        segment=segment,
        position=position,
        length=length,
        region=region,
    )


def test_segments_are_mapped_once_and_read_in_place_after_the_file_is_gone(
    short_dir: Path,
) -> None:
    first, second = ipc(run(0, range(4))[0]), ipc(run(0, range(4, 9))[0])
    (short_dir / "seg-1").write_bytes(first + b"\0" * 24 + second)
    segments = Segments(short_dir)
    a = segments.read(shared("seg-1", 0, len(first), 1, 4))
    (short_dir / "seg-1").unlink()  # the sidecar may remove it once a region was released
    b = segments.read(shared("seg-1", len(first) + 24, len(second), 2, 5))
    assert a.column("offset").to_pylist() == [0, 1, 2, 3]
    assert b.column("offset").to_pylist() == [4, 5, 6, 7, 8]
    assert len(segments) == 1
    with pytest.raises(SharedBatchError, match="cannot be mapped"):
        segments.read(shared("seg-2", 0, 10, 3, 1))
    with pytest.raises(SharedBatchError, match="not a file name"):
        segments.read(shared("../etc", 0, 10, 3, 1))
    with pytest.raises(SharedBatchError, match="outside"):
        segments.read(shared("seg-1", len(first), 10_000, 3, 1))
    with pytest.raises(SharedBatchError, match="expected 3 rows"):
        segments.read(shared("seg-1", 0, len(first), 3, 3))
    with pytest.raises(SharedBatchError, match="not an Arrow IPC stream"):
        segments.read(shared("seg-1", len(first), 24, 3, 1))


# ---- the Stream protocol, against scripted sidecars -----------------------------------

Script = Callable[[Iterator[Any], grpc.ServicerContext], Iterator[Any]]


class Seen:
    """What a scripted stream was sent: the opening and each acks message, as they come."""

    def __init__(self) -> None:
        self.opened: queue.Queue[stream_pb2.StreamOpen] = queue.Queue()
        self.acks: queue.Queue[stream_pb2.StreamAcks] = queue.Queue()
        self.nacks: queue.Queue[stream_pb2.StreamNacks] = queue.Queue()


def ack_result() -> stream_pb2.StreamResponse:
    return stream_pb2.StreamResponse(ack_result=stream_pb2.StreamAckResult())


def shm_script(directory: Path, seen: Seen, runs: list[range], segment: str) -> Script:
    """A stream that writes each run into ``segment`` (in ``directory``) and sends it as
    a SharedBatch (region ids 10, 11, ...), one batch per run, then answers every acks
    message until the client ends it."""

    def script(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        opening = next(requests).open
        seen.opened.put(opening)
        data = b""
        messages = []
        for i, offsets in enumerate(runs):
            body = ipc(run(0, offsets)[0])
            message = shared(segment, len(data), len(body), 10 + i, len(offsets))
            message.first_offset, message.last_offset = offsets[0], offsets[-1]
            messages.append(message)
            data += body + b"\0" * (-len(body) % 8)
        (directory / segment).write_bytes(data)
        for message in messages:
            yield stream_pb2.StreamResponse(batch=stream_pb2.StreamBatch(shared=[message]))
        for request in requests:
            if request.WhichOneof("kind") == "acks":
                seen.acks.put(request.acks)
                yield ack_result()
            elif request.WhichOneof("kind") == "nacks":
                seen.nacks.put(request.nacks)
                nacked = stream_pb2.StreamNackResult(nacked_count=len(request.nacks.ranges))
                yield stream_pb2.StreamResponse(nack_result=nacked)

    return script


def batches_script(seen: Seen, runs: list[range]) -> Script:
    def script(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.opened.put(next(requests).open)
        for offsets in runs:
            batch = stream_pb2.StreamBatch(batches=[record_batch(0, offsets)])
            yield stream_pb2.StreamResponse(batch=batch)
        for request in requests:
            if request.WhichOneof("kind") == "acks":
                seen.acks.put(request.acks)
                yield ack_result()

    return script


def serve_on_socket(servers: Servers, sidecar: Sidecar, directory: Path) -> str:
    """``sidecar`` on TCP (its address) and on a socket in ``directory`` with the local
    credentials the real sidecar uses: the socket's ``unix:`` target."""
    address = servers.sidecar(sidecar)
    socket = target(directory / sidecar_file_name("sc-0"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    stream_pb2_grpc.add_StreamServiceServicer_to_server(sidecar, server)
    server.add_secure_port(socket, grpc.local_server_credentials(grpc.LocalConnectionType.UDS))
    server.start()
    servers._servers.append(server)  # stopped with the others
    sidecar.address = address
    return socket


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def local_binding(address: str, socket: str) -> Any:
    bound = binding(1, address)
    bound.endpoints[0].local_address = socket
    return bound


def test_over_the_socket_columns_are_read_in_place_and_released_with_the_ack(
    servers: Servers, short_dir: Path
) -> None:
    seen = Seen()
    sidecar = Sidecar([], streams=[shm_script(short_dir, seen, [range(0, 5), range(5, 8)], "s1")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns(100)
        parts = [next(batches)]
        while sum(map(len, parts)) < 8:  # the second run may come in a batch of its own
            parts.append(next(batches))
        opening = seen.opened.get(timeout=10)
        assert opening.format == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        assert opening.initial_credit.records == 100
        got = joined_columns(parts)
        table = got.table
        assert table.column("offset").to_pylist() == list(range(8))
        assert table.column("value").to_pylist() == [b"v"] * 8
        assert [r for rel in got.releases for r in rel.regions] == [10, 11]
        assert client.ack(got) == 8
        acks = seen.acks.get(timeout=10)
        assert [(r.from_offset, r.to_offset) for r in acks.ranges] == [
            (s.from_offset, s.to_offset) for s in got.spans
        ]
        assert list(acks.released) == [r for rel in got.releases for r in rel.regions]
        batches.close()


def test_nack_and_ack_nowait_release_their_regions_too(servers: Servers, short_dir: Path) -> None:
    seen = Seen()
    sidecar = Sidecar([], streams=[shm_script(short_dir, seen, [range(0, 5), range(5, 8)], "s6")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns(5)  # credit for the first run only
        first = next(batches)
        assert [r for rel in first.releases for r in rel.regions] == [10]
        assert client.nack(first) == 5
        nacks = seen.nacks.get(timeout=10)
        assert [(r.from_offset, r.to_offset) for r in nacks.ranges] == [(0, 5)]
        released = seen.acks.get(timeout=10)  # the regions alone, right after
        assert not released.ranges and list(released.released) == [10]
        second = next(batches)
        assert client.ack_nowait(second).result(timeout=10) == 3
        acks = seen.acks.get(timeout=10)
        assert [(r.from_offset, r.to_offset) for r in acks.ranges] == [(5, 8)]
        assert list(acks.released) == [11]
        batches.close()


def test_auto_ack_releases_a_batch_when_the_next_one_is_asked_for(
    servers: Servers, short_dir: Path
) -> None:
    seen = Seen()
    runs = [range(0, 5), range(5, 8)]
    sidecar = Sidecar([], streams=[shm_script(short_dir, seen, runs, "s2")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner), auto_ack=True) as client:
        # A window of one run: with more, a reader slower than the sidecar (a loaded
        # machine) joins both runs into one batch and never asks for another.
        batches = client.stream_columns(5)
        regions: list[int] = []
        while len(regions) < 2:
            got = next(batches)
            regions += [r for rel in got.releases for r in rel.regions]
        assert regions == [10, 11]
        assert seen.opened.get(timeout=10).auto_ack
        # The first batch's regions went back, alone, when the loop asked again.
        first = seen.acks.get(timeout=10)
        assert not first.ranges and not first.acks and first.released[0] == 10
        batches.close()


def test_a_reopened_stream_is_not_sent_the_regions_of_the_one_that_ended(
    servers: Servers, short_dir: Path
) -> None:
    seen = Seen()

    def ends(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        # Ends cleanly after its batch (UNAVAILABLE would move the client to TCP).
        yield from shm_script(short_dir, seen, [range(0, 4)], "s3")(iter([next(requests)]), context)

    sidecar = Sidecar([], streams=[ends, shm_script(short_dir, seen, [range(4, 6)], "s4")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns(4)  # one run at a time, however slow this reader is
        old = next(batches)
        assert old.table.column("offset").to_pylist() == [0, 1, 2, 3]
        wait_for(lambda: sidecar.opened == 2)
        new = next(batches)
        assert new.table.column("offset").to_pylist() == [4, 5]
        # Both regions are numbered 10, each on its own opening. The old batch's ack goes
        # on the stream's new opening, which is not sent the old opening's region (its own
        # region 10 is still in use).
        assert client.ack(old) == 4
        old_acks = seen.acks.get(timeout=10)
        assert [(r.from_offset, r.to_offset) for r in old_acks.ranges] == [(0, 4)]
        assert list(old_acks.released) == []
        assert client.ack(new) == 2
        new_acks = seen.acks.get(timeout=10)
        assert [(r.from_offset, r.to_offset) for r in new_acks.ranges] == [(4, 6)]
        assert list(new_acks.released) == [10]
        batches.close()


def test_over_tcp_the_stream_asks_for_batches_and_hands_out_the_same_columns(
    servers: Servers,
) -> None:
    seen = Seen()
    sidecar = Sidecar([], streams=[batches_script(seen, [range(0, 5)])])
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        assert seen.opened.get(timeout=10).format == stream_pb2.DELIVERY_FORMAT_BATCHES
        assert got.table.equals(pa.Table.from_batches([run(0, range(0, 5))[0]]))
        assert got.spans == (Span(TOPIC, 0, 1, 0, 5, 5),) and not got.releases
        assert client.ack(got) == 5
        acks = seen.acks.get(timeout=10)
        assert not acks.released
        batches.close()


def test_a_socket_sidecar_that_refuses_arrow_shm_is_read_with_batches(
    servers: Servers, short_dir: Path
) -> None:
    seen = Seen()

    def refuses(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.opened.put(next(requests).open)
        abort(context, invalid("open.format", "DELIVERY_FORMAT_ARROW_SHM is not served"))
        yield from ()

    sidecar = Sidecar([], streams=[refuses, batches_script(seen, [range(0, 3)])])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        formats = [seen.opened.get(timeout=10).format for _ in range(2)]
        assert formats == [
            stream_pb2.DELIVERY_FORMAT_ARROW_SHM,
            stream_pb2.DELIVERY_FORMAT_BATCHES,
        ]
        assert got.table.column("offset").to_pylist() == [0, 1, 2]
        batches.close()


def test_a_socket_sidecar_that_refuses_the_frame_socket_is_read_on_the_call(
    servers: Servers, short_dir: Path
) -> None:
    """Refused on open.frame_socket (a sidecar that cannot serve it): the stream opens
    again without it, still ARROW_SHM, and never asks again."""
    seen = Seen()

    def refuses(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.opened.put(next(requests).open)
        abort(context, invalid("open.frame_socket", "the frame socket cannot be served"))
        yield from ()

    sidecar = Sidecar([], streams=[refuses, shm_script(short_dir, seen, [range(0, 3)], "s7")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        openings = [seen.opened.get(timeout=10) for _ in range(2)]
        assert [o.frame_socket for o in openings] == [True, False]
        assert [o.format for o in openings] == [stream_pb2.DELIVERY_FORMAT_ARROW_SHM] * 2
        assert got.table.column("offset").to_pylist() == [0, 1, 2]
        assert client.ack(got) == 3  # on the call
        assert [(r.from_offset, r.to_offset) for r in seen.acks.get(timeout=10).ranges] == [(0, 3)]
        batches.close()


def test_a_frame_socket_the_client_cannot_use_reopens_the_stream_on_the_call(
    servers: Servers, short_dir: Path
) -> None:
    """The sidecar names a socket that is not there (or not trusted): the client sends no
    token, cancels that opening and streams on the call from then on."""
    seen = Seen()

    def names_nothing(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.opened.put(next(requests).open)
        named = stream_pb2.FrameSocket(name="sidecar-sc-0.frames", token=bytes(16))
        yield stream_pb2.StreamResponse(frame_socket=named)
        for _ in requests:  # until the client cancels
            pass

    sidecar = Sidecar([], streams=[names_nothing, shm_script(short_dir, seen, [range(0, 2)], "s8")])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        assert [seen.opened.get(timeout=10).frame_socket for _ in range(2)] == [True, False]
        assert got.table.column("offset").to_pylist() == [0, 1]
        batches.close()


def test_an_unreadable_shared_batch_reopens_the_stream_with_batches(
    servers: Servers, short_dir: Path
) -> None:
    """A segment the client cannot see (another container's view of the volume): the
    stream ends and the sidecar delivers the records again as BATCHES."""
    seen = Seen()

    def missing_segment(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.opened.put(next(requests).open)
        message = shared("nowhere", 0, 100, 10, 3)
        yield stream_pb2.StreamResponse(batch=stream_pb2.StreamBatch(shared=[message]))
        for _ in requests:
            pass

    sidecar = Sidecar([], streams=[missing_segment, batches_script(seen, [range(0, 3)])])
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        assert got.table.column("offset").to_pylist() == [0, 1, 2]
        assert seen.opened.get(timeout=10).format == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        assert seen.opened.get(timeout=10).format == stream_pb2.DELIVERY_FORMAT_BATCHES
        batches.close()


def test_a_batch_message_holds_both_shared_runs_and_record_batches(short_dir: Path) -> None:
    """A run too large for the segment comes as a RecordBatch beside the shared ones."""
    body = ipc(run(0, range(0, 4))[0])
    (short_dir / "s5").write_bytes(body)
    message = stream_pb2.StreamBatch(
        shared=[shared("s5", 0, len(body), 10, 4)], batches=[record_batch(1, range(7, 9))]
    )
    message.shared[0].delivery_count, message.batches[0].delivery_count = 3, 2
    got = columns_of(message, Segments(short_dir), "stream", 1)
    assert got.delivery_counts == (3, 2)
    assert [(s.partition, s.from_offset, s.to_offset) for s in got.spans] == [(0, 0, 4), (1, 7, 9)]
    assert got.table.column("offset").to_pylist() == [0, 1, 2, 3, 7, 8]
    assert got.releases == (Release("stream", 1, (10,)),)
    with pytest.raises(SharedBatchError):
        columns_of(message, None, "stream", 1)  # not asked for


def test_record_batches_over_tcp_become_columns_in_place_of_the_received_bytes() -> None:
    """``wire.stream_batch_fields`` + ``columns_of_fields``: the same table as protobuf's
    message through ``from_message``, its values a view of the received bytes; anything
    but a batch of plain RecordBatches is left to protobuf."""
    rbs = [record_batch(0, range(3, 7)), record_batch(2, range(0, 2), epoch=5)]
    rbs[0].keys, rbs[0].key_lengths = b"abcd", array("i", [1, -1, 2, 1]).tobytes()
    rbs[1].timestamps = array("q", [1_700_000_000_000, -1]).tobytes()
    message = stream_pb2.StreamResponse(batch=stream_pb2.StreamBatch(batches=rbs))
    data = message.SerializeToString()
    fields = wire.stream_batch_fields(data)
    assert fields is not None
    got = columns_of_fields(fields)
    wanted = columns_of_batches(stream_pb2.StreamResponse.FromString(data).batch)
    assert got.table.equals(wanted.table) and got.spans == wanted.spans
    assert got.delivery_counts == wanted.delivery_counts == (1, 1)
    assert got.spans[1] == Span(TOPIC, 2, 5, 0, 2, 2)
    values = got.record_batches[0].column("value").buffers()[2]
    start = pa.py_buffer(data).address
    assert start <= values.address < start + len(data)  # not copied
    for other in (
        stream_pb2.StreamResponse(ack_result=stream_pb2.StreamAckResult()),
        stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(shared=[shared("s", 0, 1, 1, 1)], batches=rbs)
        ),
        stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(
                batches=[
                    stream_pb2.RecordBatch(
                        topic=TOPIC,
                        offsets=array("q", [1]).tobytes(),
                        value_lengths=array("i", [0]).tobytes(),
                        headers=[stream_pb2.RecordBatchHeaders(index=0)],
                    )
                ]
            )
        ),
    ):
        assert wire.stream_batch_fields(other.SerializeToString()) is None


def test_a_sidecar_bound_again_while_the_application_is_busy_gets_a_new_stream(
    servers: Servers, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The e2e fall back's hang (tests/e2e/test_stream_columns.py): while the application
    does not ask for a batch (busy restarting the sidecar there), the binding drops the
    sidecar (its channels are closed: the stream ends, and its next opening meets the
    closed channel) and names it again, over TCP, before the reader looks at the streams.
    The reader must see that the stream it has for that address is of the old, closed
    sidecar and open one on the new: the records the sidecar sends there arrive."""
    seen = Seen()
    sidecar = Sidecar(
        [],
        streams=[
            shm_script(short_dir, seen, [range(0, 4)], "s7"),
            batches_script(seen, [range(0, 6)]),  # what was not acked, again, and more
        ],
    )
    socket = serve_on_socket(servers, sidecar, short_dir)
    assigner = Assigner(local_binding(sidecar.address, socket))
    caplog.set_level(logging.INFO, logger="dsclient")
    with (
        DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client,
        futures.ThreadPoolExecutor(1) as reader,
    ):
        batches = client.stream_columns(100)
        first = next(batches)
        assert first.table.column("offset").to_pylist() == [0, 1, 2, 3]
        (old,) = client._streams.values()
        # The application is busy: no next(batches) while the binding changes twice.
        assigner.watch.put(binding(2))  # the sidecar left: its channels closed
        wait_for(lambda: not client.endpoints)
        assigner.watch.put(binding(3, sidecar.address))  # back, on TCP only
        wait_for(lambda: client.endpoints == [sidecar.address])
        wait_for(lambda: not old._thread.is_alive())  # the old stream met the closed channel
        # Asked again: the records sent on the new sidecar's stream arrive.
        asked = reader.submit(next, batches)
        try:
            got = asked.result(timeout=20)
        except futures.TimeoutError:
            client.close()  # ends the reader's loop
            pytest.fail("no batch after the sidecar was bound again: its stream was not replaced")
        assert got.table.column("offset").to_pylist() == [0, 1, 2, 3, 4, 5]
        assert seen.opened.get(timeout=10).format == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        assert seen.opened.get(timeout=10).format == stream_pb2.DELIVERY_FORMAT_BATCHES
        batches.close()
    # Both the old stream's end and its replacement are logged.
    assert "stream ends, its channel was closed" in caplog.text
    assert "its stream was of a replaced sidecar; opening a new one" in caplog.text


def test_a_response_the_client_fails_on_reopens_the_stream_and_is_logged(
    servers: Servers, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error the stream does not expect while reading a response ends that opening, not
    the stream's thread: it is logged, the stream re-opens, and the sidecar's records
    (delivered again) arrive."""
    import dsclient.stream

    seen = Seen()
    sidecar = Sidecar([], streams=[batches_script(seen, [range(0, 3)])])
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    real = dsclient.stream.columns_of_fields
    calls = []

    def fails_once(fields: list[wire.BatchFields]) -> ColumnBatch:
        calls.append(len(fields))
        if len(calls) == 1:
            raise RuntimeError("scripted failure")
        return real(fields)

    monkeypatch.setattr(dsclient.stream, "columns_of_fields", fails_once)
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream_columns()
        got = next(batches)
        assert got.table.column("offset").to_pylist() == [0, 1, 2]
        assert sidecar.opened == 2 and len(calls) == 2
        batches.close()
    assert "stream failed; re-opening" in caplog.text and "scripted failure" in caplog.text
