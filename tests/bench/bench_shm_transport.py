"""Benchmark: what the transport costs per record — Arrow IPC chunks over a gRPC Unix socket
vs written once into shared memory with only (slot, offset, length) on the socket.

    .venv/bin/python tests/bench/bench_shm_transport.py [--sizes 100,1024] [--rounds 5]
                                                        [--chunks 100] [--chunk-bytes 1048576]

The ceiling of issue 22 item 1's zero-copy delivery mode: how much CPU per record (sender +
receiver) the bytes' journey from the sidecar to the application costs, and how much of it
a shared-memory hand-over would take away. Both sides start from the same ``pa.RecordBatch``
(turning Kafka messages into columns is the same work in every mode and is left out), in
the columns ``ReadRange``'s ``ARROW_IPC`` chunks have (``arrow_chunks.SCHEMA``), as
many records per chunk as a live ``Stream`` response holds (``stream_rpc.py``: up to 10,000
records and 4 MiB: 10,000 at 100 B, 4,096 at 1 KiB; ``--chunk-bytes`` sets the values'
bytes). Five modes, measured in interleaved rounds:

``inproc``
    no transport at all, one process: the sender's IPC encoding to ``bytes`` (what
    ``arrow_chunks.Columns.encode`` does) and the receiver's ``ipc.open_stream`` +
    ``read_all`` on it: the floor both transports add to.
``grpc``
    a server process and this process on a Unix domain socket (what the sidecar's
    ``DS_UDS_DIR`` listener is), one bidi stream as ``Stream`` + ``ack`` has: the server
    encodes each chunk to bytes, puts it in ``ReadRangeResponse.arrow_ipc`` (the real
    message and field), gRPC serializes, copies and ``sendmsg``\\ s it; the client
    ``recvmsg``\\ s, parses the response and opens the IPC stream on its ``bytes`` field
    (pyarrow wraps it without a copy).
``shm``
    the same stream and server, but the server writes each chunk's IPC stream once, straight
    into a slot of a ring in a ``/dev/shm`` file (a memory ``emptyDir`` in a pod: gRPC's
    Python API cannot pass a memfd over its socket), mapped by both processes; the response
    carries (slot, offset, length) only; the client opens the IPC stream on its own mapping
    of that slice (zero copy: the columns are read in place) and releases the slot with its
    ack, which the server reuses.
``wire_inproc``, ``wire``
    today's ``Stream`` delivery (``DELIVERY_FORMAT_BATCHES``) of the same records for
    comparison: the sidecar's ``wire.stream_response`` bytes (handed to gRPC as they are,
    as ``stream_rpc.py`` does) and the client's ``wire.parse_stream_batch`` (each key and value
    cut from the message into its own ``bytes``: per-record work of the client, not of the
    transport), in one process and over the socket.

The client reads each chunk the same way in every mode (row count, the sum of the value
lengths: what an application reading the columns in place touches first), and each chunk's
row count and first and last value are checked once per round. A window of 4 chunks in
flight (the ring's slots) keeps both processes busy as ``Stream``'s credit does.

For each mode and size: the CPU microseconds per record of the sender (the server process,
all its threads: gRPC's included, from its ``time.process_time()``; it runs ``grpc.aio``
with the sidecar's server options, GC and malloc settings), of the receiver (this process,
an application's defaults; ``--client-gc frozen`` freezes its GC as the sidecar does), and
their sum, best and median of the rounds; what each transport adds to its ``inproc`` mode;
``shm/grpc``; and ``grpc - shm`` as a share of ``--path-us``: the CPU per record of the
sidecar path to compare with (application + sidecar, ``bench_sidecar.py``'s ``cu`` row;
default its run of 27 Nov 21:10 beside this one: 2.55 µs at 100 B, 4.03 µs at 1 KiB). The
CPU time moves less with the machine's load than the wall-clock rate, printed beside it for
reference only. Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import queue
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as pa_ipc
from google.protobuf import wrappers_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "protos" / "gen" / "python"))

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records import wire
from dsclient.records.arrow_batches import SCHEMA
from dsclient.records.batches import Slice, chunk_of
from services.consumer_sidecar.__main__ import GEN0_THRESHOLD, tune_malloc
from services.consumer_sidecar.stream_rpc import STREAM_COLUMNS_BYTES, STREAM_COLUMNS_RECORDS
from services.runtime.grpcserver import SERVER_OPTIONS

SERVICE = "/bench.shm.Transport/"
WINDOW = 4  # chunks in flight; also the ring's slot count
SLOT_SLACK = 256 * 1024  # per slot, past the values: the other columns and IPC framing
DESCRIPTOR = struct.Struct("<qqq")  # slot, offset, length
DEFAULT_PATH_US = {100: 2.55, 1024: 4.03}  # bench_sidecar cu: app + sidecar, README


# ---- the chunk both sides start from -------------------------------------------------


def make_batch(size: int, chunk_bytes: int, seed: int = 0) -> pa.RecordBatch:
    """About ``chunk_bytes`` of ``size``-byte values in ``SCHEMA``'s columns, 16-byte keys,
    no headers (an empty list each), a timestamp each: one partition's run."""
    n = max(1, chunk_bytes // size)
    values = [(b"%08d" % (seed + i)).ljust(size, b"v") for i in range(n)]
    keys = [b"%016d" % i for i in range(n)]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(["bench-topic"] * n, pa.string()),
            pa.array([3] * n, pa.int32()),
            pa.array(range(seed, seed + n), pa.int64()),
            pa.array([1_700_000_000_000_000 + i for i in range(n)], pa.int64()).view(
                SCHEMA.field("timestamp").type
            ),
            pa.array([[]] * n, SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )


def encode(batch: pa.RecordBatch) -> bytes:
    """The chunk as one IPC stream in ``bytes``, as ``arrow_chunks.Columns.encode``."""
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_chunk(buf: Any) -> tuple[int, int, pa.Table]:
    """What the receiver does with a chunk in every mode: open the IPC stream on ``buf``
    (no copy) and read the columns in place: rows and total value bytes."""
    table = pa_ipc.open_stream(buf).read_all()
    value_bytes = pc.sum(pc.binary_length(table.column("value"))).as_py() or 0
    return table.num_rows, value_bytes, table


def check(table: pa.Table, expected: pa.RecordBatch) -> None:
    values = table.column("value")
    if table.num_rows != expected.num_rows or values[0] != expected.column(1)[0]:
        raise AssertionError("chunk does not match what was sent")
    if values[-1] != expected.column(1)[-1]:
        raise AssertionError("chunk's last value does not match what was sent")


def make_slice(batch: pa.RecordBatch) -> Slice:
    """The same records as the live path's chunk (``batches.Chunk``), all taken: what a
    ``Stream`` response of today's ``DELIVERY_FORMAT_BATCHES`` carries."""
    n = batch.num_rows
    chunk = chunk_of(
        array("q", batch.column(4).to_pylist()),
        array("q", [t // 1000 for t in batch.column(5).cast(pa.int64()).to_pylist()]),
        batch.column(1).to_pylist(),
        batch.column(0).to_pylist(),
        [None] * n,
    )
    return chunk.take(n, "bench-topic", 3, 1)


def read_wire(data: bytes) -> int:
    """What ``DsClient`` does with a ``Stream`` response's bytes up to its columns
    (``wire.parse_stream_batch``: each key and value cut from the message once), and the
    same touch as :func:`read_chunk`: rows and total value bytes."""
    columns = wire.parse_stream_batch(data)
    if columns is None:
        raise AssertionError("not a StreamResponse batch")
    rows = 0
    for col in columns:
        rows += len(col)
        sum(map(len, filter(None, col.values)))
    return rows


# ---- the server (the sidecar's side) --------------------------------------------------


class Ring:
    """``WINDOW`` slots of a ``/dev/shm`` file, mapped; a slot is free until the server
    writes a chunk into it and free again when the client's ack releases it."""

    def __init__(self, path: str, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, slot_bytes * WINDOW)
        finally:
            os.close(fd)
        self.file = pa.memory_map(path, "r+")
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(WINDOW):
            self.free.put(slot)

    def write(self, batch: pa.RecordBatch) -> tuple[int, int, int]:
        """The batch's IPC stream written once into a free slot: (slot, offset, length)."""
        slot = self.free.get(timeout=30)
        offset = slot * self.slot_bytes
        self.file.seek(offset)
        with pa_ipc.new_stream(self.file, SCHEMA) as writer:
            writer.write_batch(batch)
        length = self.file.tell() - offset
        if length > self.slot_bytes:
            raise RuntimeError(f"chunk of {length} B overran its slot of {self.slot_bytes} B")
        return slot, offset, length


class Server:
    """The sidecar's side, on ``grpc.aio`` with the sidecar's server options, as
    ``services/runtime/grpcserver.py`` serves ``StreamService``."""

    def __init__(self, shm_path: str, size: int, chunk_bytes: int) -> None:
        self.batch = make_batch(size, chunk_bytes)
        self.ring = Ring(shm_path, chunk_bytes + SLOT_SLACK + self.batch.num_rows * 64)
        self.slice = make_slice(self.batch)

    async def wire_stream(
        self, requests: AsyncIterator[wrappers_pb2.Int64Value], _ctx: Any
    ) -> AsyncIterator[bytes]:
        async for request in requests:  # as Grpc; each response the live path's own bytes
            for _ in range(request.value):
                yield wire.stream_response([self.slice])

    async def grpc_stream(
        self, requests: AsyncIterator[wrappers_pb2.Int64Value], _ctx: Any
    ) -> AsyncIterator[stream_pb2.ReadRangeResponse]:
        async for request in requests:  # each request: an ack asking for `value` more chunks
            for _ in range(request.value):
                yield stream_pb2.ReadRangeResponse(arrow_ipc=encode(self.batch))

    async def shm_stream(
        self, requests: AsyncIterator[wrappers_pb2.BytesValue], _ctx: Any
    ) -> AsyncIterator[wrappers_pb2.BytesValue]:
        async for request in requests:  # released slots (int64s), then how many more chunks
            words = struct.unpack(f"<{len(request.value) // 8}q", request.value)
            for slot in words[1:]:
                self.ring.free.put(slot)
            for _ in range(words[0]):
                yield wrappers_pb2.BytesValue(value=DESCRIPTOR.pack(*self.ring.write(self.batch)))

    async def cpu(self, _request: wrappers_pb2.Int64Value, _ctx: Any) -> Any:
        return wrappers_pb2.DoubleValue(value=time.process_time())


async def serve(socket_path: str, shm_path: str, size: int, chunk_bytes: int) -> None:
    server_impl = Server(shm_path, size, chunk_bytes)
    # The sidecar process's own settings (services/consumer_sidecar/__main__.py): start-up
    # objects frozen out of the GC, gen0 at 50,000, big buffers kept on the heap.
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    tune_malloc()
    i64, byt, dbl = wrappers_pb2.Int64Value, wrappers_pb2.BytesValue, wrappers_pb2.DoubleValue
    handlers = {
        "Grpc": grpc.stream_stream_rpc_method_handler(
            server_impl.grpc_stream,
            request_deserializer=i64.FromString,
            response_serializer=stream_pb2.ReadRangeResponse.SerializeToString,
        ),
        "Wire": grpc.stream_stream_rpc_method_handler(
            server_impl.wire_stream, request_deserializer=i64.FromString
        ),
        "Shm": grpc.stream_stream_rpc_method_handler(
            server_impl.shm_stream,
            request_deserializer=byt.FromString,
            response_serializer=byt.SerializeToString,
        ),
        "Cpu": grpc.unary_unary_rpc_method_handler(
            server_impl.cpu,
            request_deserializer=i64.FromString,
            response_serializer=dbl.SerializeToString,
        ),
    }
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("bench.shm.Transport", handlers)]
    )
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # runs until the parent closes our stdin
    await server.stop(0)


# ---- the client (the application's side) ----------------------------------------------


@dataclass
class Sample:
    records: int
    sender_s: float
    receiver_s: float
    wall_s: float

    def us(self, seconds: float) -> float:
        return seconds / self.records * 1e6


class Requests:
    """The request side of a bidi stream, fed from the response loop."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def __iter__(self) -> Iterator[Any]:
        while (item := self.q.get()) is not None:
            yield item


class Client:
    def __init__(self, socket_path: str, shm_path: str, batch: pa.RecordBatch) -> None:
        self.channel = grpc.insecure_channel(
            f"unix:{socket_path}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self.expected = batch
        self.slice = make_slice(batch)
        i64, byt, dbl = wrappers_pb2.Int64Value, wrappers_pb2.BytesValue, wrappers_pb2.DoubleValue
        self._grpc = self.channel.stream_stream(
            SERVICE + "Grpc",
            request_serializer=i64.SerializeToString,
            response_deserializer=stream_pb2.ReadRangeResponse.FromString,
        )
        self._wire = self.channel.stream_stream(  # bytes as they came: no deserializer
            SERVICE + "Wire", request_serializer=i64.SerializeToString, response_deserializer=None
        )
        self._shm = self.channel.stream_stream(
            SERVICE + "Shm",
            request_serializer=byt.SerializeToString,
            response_deserializer=byt.FromString,
        )
        self._cpu = self.channel.unary_unary(
            SERVICE + "Cpu",
            request_serializer=i64.SerializeToString,
            response_deserializer=dbl.FromString,
        )
        self.shm_path = shm_path
        self.mapped: pa.Buffer | None = None

    def server_cpu(self) -> float:
        value: float = self._cpu(wrappers_pb2.Int64Value()).value
        return value

    def run_grpc(self, chunks: int) -> int:
        requests = Requests()
        requests.q.put(wrappers_pb2.Int64Value(value=min(WINDOW, chunks)))
        asked, records = min(WINDOW, chunks), 0
        for got, response in enumerate(self._grpc(iter(requests)), 1):
            rows, _vbytes, table = read_chunk(response.arrow_ipc)
            if got == 1:
                check(table, self.expected)
            records += rows
            if asked < chunks:
                requests.q.put(wrappers_pb2.Int64Value(value=1))
                asked += 1
            elif got == chunks:
                requests.q.put(None)  # half-close: the server's stream ends
        return records

    def run_wire(self, chunks: int) -> int:
        requests = Requests()
        requests.q.put(wrappers_pb2.Int64Value(value=min(WINDOW, chunks)))
        asked, records = min(WINDOW, chunks), 0
        for got, response in enumerate(self._wire(iter(requests)), 1):
            records += read_wire(response)
            if asked < chunks:
                requests.q.put(wrappers_pb2.Int64Value(value=1))
                asked += 1
            elif got == chunks:
                requests.q.put(None)
        return records

    def run_shm(self, chunks: int) -> int:
        if self.mapped is None:  # mapped once, as a client maps a session's segment
            mapped = pa.memory_map(self.shm_path, "r")
            self.mapped = mapped.read_buffer(mapped.size())  # the mapping itself, no copy
        whole = self.mapped
        requests = Requests()
        requests.q.put(wrappers_pb2.BytesValue(value=struct.pack("<q", min(WINDOW, chunks))))
        asked, records = min(WINDOW, chunks), 0
        for got, response in enumerate(self._shm(iter(requests)), 1):
            slot, offset, length = DESCRIPTOR.unpack(response.value)
            rows, _vbytes, table = read_chunk(whole.slice(offset, length))
            if got == 1:
                check(table, self.expected)
            records += rows
            del table  # the columns are views of the slot: drop them before releasing it
            more = 1 if asked < chunks else 0
            asked += more
            requests.q.put(wrappers_pb2.BytesValue(value=struct.pack("<qq", more, slot)))
            if got == chunks:
                requests.q.put(None)  # half-close after the last release
        return records


def run_inproc(batch: pa.RecordBatch, chunks: int) -> tuple[int, float, float]:
    """Records, sender CPU s, receiver CPU s, both in this process."""
    sender = receiver = 0.0
    records = 0
    for i in range(chunks):
        t0 = time.process_time()
        data = encode(batch)
        t1 = time.process_time()
        rows, _vbytes, table = read_chunk(data)
        t2 = time.process_time()
        if i == 0:
            check(table, batch)
        sender += t1 - t0
        receiver += t2 - t1
        records += rows
    return records, sender, receiver


def run_wire_inproc(piece: Slice, chunks: int) -> tuple[int, float, float]:
    """As :func:`run_inproc`, for the live path's wire bytes."""
    sender = receiver = 0.0
    records = 0
    for _ in range(chunks):
        t0 = time.process_time()
        data = wire.stream_response([piece])
        t1 = time.process_time()
        records += read_wire(data)
        receiver += time.process_time() - t1
        sender += t1 - t0
    return records, sender, receiver


def measure(client: Client, mode: str, chunks: int) -> Sample:
    if mode in ("inproc", "wire_inproc"):
        w0 = time.perf_counter()
        if mode == "inproc":
            records, sender, receiver = run_inproc(client.expected, chunks)
        else:
            records, sender, receiver = run_wire_inproc(client.slice, chunks)
        return Sample(records, sender, receiver, time.perf_counter() - w0)
    run = {"grpc": client.run_grpc, "wire": client.run_wire, "shm": client.run_shm}[mode]
    s0, c0, w0 = client.server_cpu(), time.process_time(), time.perf_counter()
    records = run(chunks)
    wall, c1, s1 = time.perf_counter() - w0, time.process_time(), client.server_cpu()
    return Sample(records, s1 - s0, c1 - c0, wall)


MODES = ("inproc", "grpc", "shm", "wire_inproc", "wire")


def bench_size(size: int, args: argparse.Namespace, workdir: str) -> dict[str, list[Sample]]:
    socket_path = os.path.join(workdir, f"bench-{size}.sock")
    shm_path = os.path.join(args.shm_dir, f"ds-bench-shm-{os.getpid()}-{size}")
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", socket_path, "--shm", shm_path,
         "--sizes", str(size), "--chunk-bytes", str(args.chunk_bytes)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        batch = make_batch(size, args.chunk_bytes)
        client = Client(socket_path, shm_path, batch)
        modes = args.modes.split(",")
        for mode in modes:  # warm-up: connections, imports, first mappings
            measure(client, mode, 2 * WINDOW)
        samples: dict[str, list[Sample]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode in modes:
                samples[mode].append(measure(client, mode, args.chunks))
        client.channel.close()
        return samples
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        Path(shm_path).unlink(missing_ok=True)


def report(size: int, samples: dict[str, list[Sample]], path_us: float, rows: int) -> None:
    first = next(iter(samples.values()))
    print(f"\n{size} B values, {rows} records per chunk, {len(first)} rounds")
    print(
        f"  {'mode':11} {'sender µs/rec':>19} {'receiver µs/rec':>19} {'total µs/rec':>19}"
        f" {'rec/s (wall)':>14}"
    )
    totals: dict[str, tuple[float, float]] = {}
    for mode, runs in samples.items():
        cols = []
        for part in ("sender_s", "receiver_s", None):
            vals = [
                s.us(s.sender_s + s.receiver_s if part is None else getattr(s, part)) for s in runs
            ]
            cols.append((min(vals), statistics.median(vals)))
        totals[mode] = cols[2]
        best_rate = max(s.records / s.wall_s for s in runs)
        print(
            f"  {mode:11} "
            + " ".join(f"{b:8.3f} / {m:8.3f}" for b, m in cols)
            + f" {best_rate:14,.0f}"
        )
    if {"wire", "wire_inproc"} <= set(totals):
        (wb, wm), (wib, wim) = totals["wire"], totals["wire_inproc"]
        print(
            f"  today's wire (BATCHES) over the socket, over its inproc: "
            f"{wb - wib:+.3f} / {wm - wim:+.3f} µs per record = "
            f"{(wb - wib) / path_us:.1%} / {(wm - wim) / path_us:.1%} of {path_us} µs"
        )
    if not {"grpc", "shm", "inproc"} <= set(totals):
        return
    (gb, gm), (sb, sm), (ib, im) = totals["grpc"], totals["shm"], totals["inproc"]
    print("  (best / median of rounds)")
    print(f"  shm/grpc total CPU per record: best {sb / gb:.2f}, median {sm / gm:.2f}")
    print(
        f"  transport over inproc: grpc {gb - ib:+.3f} / {gm - im:+.3f} µs, "
        f"shm {sb - ib:+.3f} / {sm - im:+.3f} µs"
    )
    print(
        f"  grpc - shm: {gb - sb:+.3f} / {gm - sm:+.3f} µs per record = "
        f"{(gb - sb) / path_us:.1%} / {(gm - sm) / path_us:.1%} of the sidecar path's "
        f"{path_us} µs per record (application + sidecar)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=100, help="chunks per round")
    parser.add_argument(
        "--chunk-bytes",
        type=int,
        default=0,
        help="values per chunk; default as a live Stream response (10,000 records, 4 MiB)",
    )
    parser.add_argument("--shm-dir", default="/dev/shm")
    parser.add_argument("--path-us", default="", help="e.g. 100=2.55,1024=4.03")
    parser.add_argument(
        "--client-gc",
        choices=("default", "frozen"),
        default="default",
        help="frozen: this process freezes its start-up objects as the sidecar does",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="for a profile: e.g. grpc")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--shm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not args.chunk_bytes:
        args.chunk_bytes = min(STREAM_COLUMNS_RECORDS * sizes[0], STREAM_COLUMNS_BYTES)
    if args.serve:
        asyncio.run(serve(args.serve, args.shm, sizes[0], args.chunk_bytes))
        return
    path_us = dict(DEFAULT_PATH_US)
    for item in filter(None, args.path_us.split(",")):
        key, value = item.split("=")
        path_us[int(key)] = float(value)
    print(
        f"bench_shm_transport {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.client_gc == "frozen":
        gc.freeze()
        gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    print(f"receiver's GC: {args.client_gc}")
    chunk_bytes = args.chunk_bytes if "--chunk-bytes" in sys.argv else 0
    with tempfile.TemporaryDirectory(prefix="ds-shm-bench-") as workdir:
        for size in sizes:
            args.chunk_bytes = chunk_bytes or min(
                STREAM_COLUMNS_RECORDS * size, STREAM_COLUMNS_BYTES
            )
            samples = bench_size(size, args, workdir)
            rows = make_batch(size, args.chunk_bytes).num_rows
            report(size, samples, path_us.get(size, DEFAULT_PATH_US[100]), rows)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
