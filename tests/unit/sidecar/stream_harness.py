"""The StreamService servicer on an in-process gRPC server, and request builders.

The real :class:`StreamServicer` runs on a grpc.aio server on port 0, given what the sidecar
gives it: a real :class:`Serving` over a real :class:`PartitionTable` and
:class:`LeaseKeeper`. Only Kafka is faked, at its edge: the fetch thread and the committer
(:class:`FakeFetcher`) and the range readers (:class:`FakeReaders`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
from confluent_kafka import KafkaException
from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import local_socket
from dsclient.reasons import error_info
from dsclient.records.batches import chunk_from_records
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.client_access import ClientMetrics
from services.consumer_sidecar.events import LeaseEvents
from services.consumer_sidecar.frame_socket import FrameListener
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.offset_commits import CommitRequest
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.consumer_sidecar.reader import Chunk, RangeSpec
from services.consumer_sidecar.rpc import StreamServicer, add_to_server
from services.consumer_sidecar.serving import DataSignal, Serving
from services.consumer_sidecar.shm_delivery import SharedMemory
from services.runtime.auth import AuthSettings, build_guard
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP

GROUP = "g"
TOPIC = "t"


class FakeFetcher:
    """The fetch thread's and the committer's Kafka side: commits are recorded (or fail
    with ``fail``, or are dropped as the committer drops a commit whose lease lapsed, with
    ``drop``);
    partitions handed back are recorded; a rewind re-reads the partition's records from
    ``log`` (what the test buffered), as Kafka would after a seek."""

    def __init__(self, on_data: Callable[[], None] = lambda: None) -> None:
        self.commits: list[CommitRequest] = []
        self.fail: KafkaException | None = None
        self.drop = False
        self.unassigned: list[TP] = []
        self.rewinds: list[tuple[TP, int]] = []
        self.table: PartitionTable | None = None
        self.log: dict[TP, list[common_pb2.Record]] = {}
        self.on_data = on_data

    def rewind(self, tp: TP) -> None:
        assert self.table is not None
        offset = self.table.rewind(tp)
        if offset is None:
            return
        self.rewinds.append((tp, offset))
        again = [r for r in self.log.get(tp, []) if r.offset >= offset]
        if again:
            self.table.append(tp, chunk_from_records(again))
            self.on_data()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def commit(self, requests: list[CommitRequest]) -> list[CommitRequest]:
        if self.fail is not None:
            raise self.fail
        if self.drop:
            return []
        self.commits.extend(requests)
        return requests

    def unassign(self, tp: TP) -> None:
        self.unassigned.append(tp)

    async def commit_async(self, requests: list[CommitRequest]) -> list[CommitRequest]:
        return self.commit(requests)


@dataclass
class FakeReaders:
    """ReadRange's Kafka side: ``chunks`` in order (``before_chunk(i)`` runs before the
    i-th is handed out), or ``fail`` raised by open()."""

    high: int = 1000
    chunks: list[Chunk] = field(default_factory=list)
    opened: list[RangeSpec] = field(default_factory=list)
    fail: Exception | None = None
    before_chunk: Callable[[int], None] = lambda _index: None
    prefetch_bytes: int = 0  # what a reader's consumer may prefetch (the read budget)

    def __post_init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.executor = ThreadPoolExecutor(2)

    def watermarks(self, tp: TP) -> tuple[int, int]:
        return 0, self.high

    def open(self, spec: RangeSpec) -> Any:
        if self.fail is not None:
            raise self.fail
        self.opened.append(spec)
        chunks = list(self.chunks)
        handed = iter(range(len(chunks) + 1))

        def next_chunk() -> Chunk | None:
            self.before_chunk(next(handed))
            return chunks.pop(0) if chunks else None

        return SimpleNamespace(next_chunk=next_chunk, close=lambda: None)

    def close(self) -> None:
        self.executor.shutdown()


CONSUMER_CONFIG = {"bootstrap.servers": "kafka:9092", "sasl.password": "***"}


class Sidecar:
    """What the servicer is given in the sidecar: a real Serving over a real PartitionTable
    and LeaseKeeper. Only Kafka is faked, at its edge (FakeFetcher, FakeReaders)."""

    def __init__(self, events: LeaseEvents | None = None) -> None:
        """``events``: the lease keeper's, as a test listens to them; the data signal's
        wake-ups are added as the sidecar wires them (consumer_sidecar/app.py): records due
        again wake the Streams, as a renewal and a lease verified after a stall do."""
        self.table = PartitionTable(64 * 1024 * 1024, time.monotonic)
        self.data = DataSignal()
        self.fetcher = FakeFetcher(on_data=self.data.notify)
        self.fetcher.table = self.table
        events = events or LeaseEvents()
        self.keeper = LeaseKeeper(
            self.table,
            self.fetcher,  # type: ignore[arg-type]
            self.fetcher,  # type: ignore[arg-type]  # the committer's Kafka side too
            commit_interval=1.0,
            commit_max_acks=1000,
            events=dataclasses.replace(
                events,
                on_renewed=self.data.notify,
                commits=dataclasses.replace(events.commits, on_verified=self.data.notify),
                redelivery=dataclasses.replace(
                    events.redelivery,
                    on_redelivery=lambda _why, _records: self.data.notify(),
                ),
            ),
        )
        self.connected = True  # the assigner session
        self.serving = Serving(
            self.table,
            self.keeper,
            self.data,
            group=GROUP,
            sidecar_id="sc-1",
            connected=lambda: self.connected,
            consumer_config=lambda: dict(CONSUMER_CONFIG),
        )

    def hold(self, partition: int, epoch: int = 1, start: int = 0, ttl: float = 60) -> Partition:
        part = Partition(
            tp=TP(TOPIC, partition),
            epoch=epoch,
            deadline=time.monotonic() + ttl,
            acks=PartitionAcks(start),
            committed=start,
            position=start,
            ready=True,
            kafka_fenced=self.keeper.kafka_fenced,  # as a grant takes the group's fencing
        )
        self.table.add(part)
        return part

    def buffer(self, partition: int, offsets: range) -> None:
        """As the fetch thread does: append records, then notify."""
        records = [
            common_pb2.Record(topic=TOPIC, partition=partition, offset=o, value=b"v%d" % o)
            for o in offsets
        ]
        self.fetcher.log.setdefault(TP(TOPIC, partition), []).extend(records)
        assert self.table.append(TP(TOPIC, partition), chunk_from_records(records))
        self.data.notify()


Body = Callable[[stream_pb2_grpc.StreamServiceStub, Sidecar], Awaitable[None]]


def run(
    body: Body,
    readers: FakeReaders | None = None,
    servicer_class: type[StreamServicer] = StreamServicer,
    shared_memory: SharedMemory | None = None,
    clients: ClientMetrics | None = None,
    auth: AuthSettings | None = None,
    events: LeaseEvents | None = None,
    frames: bool = False,
) -> None:
    """``body`` against the servicer over TCP; with ``shared_memory``, over a Unix socket
    in its directory (``DELIVERY_FORMAT_ARROW_SHM`` served, and with ``frames`` the frame
    socket); with ``auth``, behind the authorization interceptor of a sidecar serving
    GROUP; ``events``: the lease keeper's."""

    async def main() -> None:
        sidecar = Sidecar(events)
        sidecar.data.bind_loop(asyncio.get_running_loop())
        listener = None
        if frames:
            assert shared_memory is not None, "the frame socket is served beside a local one"
            listener = FrameListener(shared_memory.directory, "sc-1")
        servicer = servicer_class(
            sidecar.serving,
            readers or FakeReaders(),  # type: ignore[arg-type]
            clients=clients,
            shared_memory=shared_memory,
            frames=listener,
        )
        socket = None
        if shared_memory is not None:
            socket = shared_memory.directory / local_socket.sidecar_file_name("sc-1")
        guard = build_guard(auth, CollectorRegistry(), "ds-sidecar") if auth is not None else None
        server = create_server(
            ServiceSettings(grpc_port=0, http_port=0),
            [
                GrpcService(
                    "dataservice.sidecar.v1.StreamService",
                    servicer,
                    add_to_server,
                )
            ],
            local_socket_path=socket,
            auth=guard.interceptor(served_group=GROUP) if guard is not None else None,
        )
        await server.server.start()
        target = local_socket.target(socket) if socket else f"127.0.0.1:{server.port}"
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                await asyncio.wait_for(
                    body(stream_pb2_grpc.StreamServiceStub(channel), sidecar), 20
                )
        finally:
            await server.server.stop(0)
            if listener is not None:
                listener.close()

    asyncio.run(main())


def reason_of(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    info = error_info(err)
    assert info is not None, err
    return err.code(), info.reason, dict(info.metadata)


def opening(
    records: int = 0, nbytes: int = 0, auto_ack: bool = False, **kw: Any
) -> stream_pb2.StreamRequest:
    return stream_pb2.StreamRequest(
        open=stream_pb2.StreamOpen(
            client_id=kw.get("client_id", "c1"),
            group=kw.get("group", GROUP),
            auto_ack=auto_ack,
            initial_credit=stream_pb2.StreamCredit(records=records, bytes=nbytes),
            format=kw.get("format", stream_pb2.DELIVERY_FORMAT_UNSPECIFIED),
            frame_socket=kw.get("frame_socket", False),
        )
    )


class Requests:
    """A request stream the test feeds as it goes."""

    def __init__(self, *first: stream_pb2.StreamRequest) -> None:
        self.queue: asyncio.Queue[stream_pb2.StreamRequest | None] = asyncio.Queue()
        for request in first:
            self.queue.put_nowait(request)

    def send(self, request: stream_pb2.StreamRequest | None) -> None:
        self.queue.put_nowait(request)

    async def __aiter__(self) -> AsyncIterator[stream_pb2.StreamRequest]:
        while (request := await self.queue.get()) is not None:
            yield request


def acks_of(records: Any, epoch: int | None = None) -> list[stream_pb2.RecordAck]:
    return [
        stream_pb2.RecordAck(
            topic=r.topic,
            partition=r.partition,
            offset=r.offset,
            lease_epoch=r.lease_epoch if epoch is None else epoch,
        )
        for r in records
    ]


def fetch_request(wait_ms: int = 0, **kw: Any) -> stream_pb2.FetchRequest:
    fields: dict[str, Any] = {"client_id": "c", "group": GROUP, "max_records": 100}
    fields.update(kw)
    request = stream_pb2.FetchRequest(**fields)
    request.max_wait.FromMilliseconds(wait_ms)
    return request


def range_ack(partition: int, lo: int, hi: int, epoch: int) -> stream_pb2.RangeAck:
    return stream_pb2.RangeAck(
        topic=TOPIC, partition=partition, from_offset=lo, to_offset=hi, lease_epoch=epoch
    )


def commit(partition: int, offset: int, epoch: int) -> stream_pb2.OffsetCommit:
    return stream_pb2.OffsetCommit(
        topic=TOPIC, partition=partition, offset=offset, lease_epoch=epoch
    )


def read_request(**kw: Any) -> stream_pb2.ReadRangeRequest:
    fields: dict[str, Any] = {
        "client_id": "spark",
        "group": GROUP,
        "topic": TOPIC,
        "partition": 0,
        "from_offset": 0,
        "to_offset": 10,
    }
    fields.update(kw)
    return stream_pb2.ReadRangeRequest(**fields)


async def read_all(
    stub: stream_pb2_grpc.StreamServiceStub, request: stream_pb2.ReadRangeRequest
) -> list[stream_pb2.ReadRangeResponse]:
    return [response async for response in stub.ReadRange(request)]
