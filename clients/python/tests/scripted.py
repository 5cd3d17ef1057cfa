"""Scripted peers for DsClient unit tests: an assigner whose ``Bind`` answers and
``WatchBinding`` pushes are given by the test, and sidecars that log every ``Fetch`` and
``Stream`` request and answer as told. Plain ``grpc.server`` servers on free loopback
ports (optionally with TLS), so the client under test makes real calls over real channels.
"""

from __future__ import annotations

import queue
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.reasons import LEADER_METADATA_KEY, DsError, Reason

TOPIC = "t"

# What a scripted watch does next: push a binding, end with a status (a DsError carries
# its ErrorInfo and trailing metadata), or end cleanly (None).
WatchStep = types_pb2.Binding | grpc.StatusCode | DsError | None


@dataclass(frozen=True)
class _Status(grpc.Status):  # type: ignore[misc]
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


# Where gRPC carries a failed call's google.rpc.Status (with its ErrorInfo).
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def abort(context: grpc.ServicerContext, answer: grpc.StatusCode | DsError) -> None:
    """End the call with ``answer``: a bare status, or a DsError with its ErrorInfo and
    trailing metadata (``ds-leader``)."""
    if isinstance(answer, grpc.StatusCode):
        context.abort(answer, f"scripted {answer.name}")
    # What grpcio-status's rpc_status.to_status builds (the Status in its trailing-metadata
    # key), without it: the client package does not depend on grpcio-status.
    status = answer.to_status()
    context.abort_with_status(
        _Status(
            answer.code,
            status.message,
            ((STATUS_DETAILS_KEY, status.SerializeToString()), *answer.trailing.items()),
        )
    )


def not_leader(leader: str) -> DsError:
    return DsError(
        Reason.NOT_LEADER, "this assigner is a follower", trailing={LEADER_METADATA_KEY: leader}
    )


def binding(version: int, *addresses: str) -> types_pb2.Binding:
    """A binding of ``addresses``, sidecar i serving partition i."""
    return types_pb2.Binding(
        version=version,
        endpoints=[
            types_pb2.SidecarEndpoint(
                sidecar_id=f"sc-{i}",
                address=address,
                partitions=[common_pb2.TopicPartition(topic=TOPIC, partition=i)],
            )
            for i, address in enumerate(addresses)
        ],
    )


def record_batch(partition: int, offsets: range, epoch: int = 1) -> stream_pb2.RecordBatch:
    return stream_pb2.RecordBatch(
        topic=TOPIC,
        partition=partition,
        lease_epoch=epoch,
        offsets=array("q", offsets).tobytes(),
        value_lengths=array("i", [1] * len(offsets)).tobytes(),
        values=b"v" * len(offsets),
    )


def wait_for(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


class Assigner(binding_pb2_grpc.BindingServiceServicer):
    """``Bind`` answers ``bind`` (a binding, or a status to end with); each
    ``WatchBinding`` takes its steps from ``watch`` (shared by the watches in turn)."""

    def __init__(self, bind: types_pb2.Binding | grpc.StatusCode | DsError) -> None:
        self.bind = bind
        self.watch: queue.Queue[WatchStep] = queue.Queue()
        self.binds = 0
        self.watches: list[int] = []  # the known_version of each watch
        self.metadata: list[dict[str, str]] = []  # every call's invocation metadata

    def _called(self, context: grpc.ServicerContext) -> None:
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata()})

    def Bind(self, request: Any, context: grpc.ServicerContext) -> binding_pb2.BindResponse:
        self._called(context)
        self.binds += 1
        if isinstance(self.bind, (grpc.StatusCode, DsError)):
            abort(context, self.bind)
        return binding_pb2.BindResponse(binding=self.bind)

    def WatchBinding(
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[binding_pb2.WatchBindingResponse]:
        self._called(context)
        self.watches.append(request.known_version)
        while context.is_active():
            try:
                step = self.watch.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(step, types_pb2.Binding):
                yield binding_pb2.WatchBindingResponse(binding=step)
            elif step is None:
                return
            else:
                abort(context, step)

    def Unbind(self, request: Any, context: grpc.ServicerContext) -> binding_pb2.UnbindResponse:
        self._called(context)
        return binding_pb2.UnbindResponse()


def idle(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
    """A Stream that sends nothing until the client ends it."""
    for _ in requests:
        pass
    yield from ()


@dataclass
class FetchSeen:
    address: str
    max_wait_present: bool
    max_wait: float


@dataclass
class Sidecar(stream_pb2_grpc.StreamServiceServicer):
    """A sidecar at ``address`` (set once served) that logs what it is asked.

    ``Fetch`` answers the next of ``fetch_batches`` (or nothing, after waiting
    ``max_wait``); ``Stream`` runs ``streams`` (one function per opening, the last one
    repeating; none: :func:`idle`) with the request iterator; ``Ack`` accepts everything
    and logs it. With ``reads_carried_acks``, a Fetch's ``ack_ranges`` are logged in
    ``carried`` and answered in ``acks`` (with ``defer_answers``, in the next response),
    those of partition ``refuse_partition`` refused (stale epoch); without, they are
    ignored, as a sidecar older than the field does."""

    fetches: list[FetchSeen]  # shared by the sidecars of a test: the order they were asked
    address: str = ""
    fetch_batches: queue.Queue[stream_pb2.RecordBatch] = field(default_factory=queue.Queue)
    streams: list[Callable[[Iterator[Any], grpc.ServicerContext], Iterator[Any]]] = field(
        default_factory=list
    )
    opened: int = 0
    acks: list[stream_pb2.AckRequest] = field(default_factory=list)
    reads_carried_acks: bool = False
    refuse_partition: int = -1
    defer_answers: bool = False  # answer carried acks with the next response, not this one
    carried: list[list[stream_pb2.RangeAck]] = field(default_factory=list)
    pending_answers: list[stream_pb2.FetchAckAnswer] = field(default_factory=list)

    def Fetch(self, request: Any, context: grpc.ServicerContext) -> stream_pb2.FetchResponse:
        wait = request.max_wait.ToNanoseconds() / 1e9
        self.fetches.append(FetchSeen(self.address, request.HasField("max_wait"), wait))
        acks = None
        if self.reads_carried_acks and (request.ack_ranges or self.pending_answers):
            answers, self.pending_answers = self.pending_answers, []
            if request.ack_ranges:
                self.carried.append(list(request.ack_ranges))
                refused = [
                    stream_pb2.RejectedRangeAck(ack=r, reason=stream_pb2.REJECT_REASON_STALE_EPOCH)
                    for r in request.ack_ranges
                    if r.partition == self.refuse_partition
                ]
                result = stream_pb2.StreamAckResult(
                    acked_count=len(request.ack_ranges) - len(refused), rejected_ranges=refused
                )
                answer = stream_pb2.FetchAckAnswer(seq=request.ack_seq, result=result)
                (self.pending_answers if self.defer_answers else answers).append(answer)
            applied = request.ack_seq if request.ack_ranges else 0
            acks = stream_pb2.FetchAckAnswers(applied_seq=applied, answers=answers)
        try:
            batches = [self.fetch_batches.get_nowait()]
        except queue.Empty:
            time.sleep(wait)
            batches = []
        return stream_pb2.FetchResponse(batches=batches, acks=acks)

    def Stream(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[stream_pb2.StreamResponse]:
        script = self.streams[min(self.opened, len(self.streams) - 1)] if self.streams else idle
        self.opened += 1
        yield from script(request_iterator, context)

    def Ack(self, request: Any, context: grpc.ServicerContext) -> stream_pb2.AckResponse:
        self.acks.append(request)
        return stream_pb2.AckResponse(acked_count=len(request.ranges))

    def Nack(self, request: Any, context: grpc.ServicerContext) -> stream_pb2.NackResponse:
        return stream_pb2.NackResponse()


class Servers:
    """grpc servers on free loopback ports, stopped together."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self.credentials = credentials
        self._servers: list[grpc.Server] = []

    def _serve(self, add: Callable[[grpc.Server], None]) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        add(server)
        if self.credentials is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            port = server.add_secure_port("127.0.0.1:0", self.credentials)
        server.start()
        self._servers.append(server)
        return f"127.0.0.1:{port}"

    def assigner(self, servicer: Assigner) -> str:
        return self._serve(
            lambda s: binding_pb2_grpc.add_BindingServiceServicer_to_server(servicer, s)
        )

    def sidecar(self, servicer: Sidecar) -> str:
        servicer.address = self._serve(
            lambda s: stream_pb2_grpc.add_StreamServiceServicer_to_server(servicer, s)
        )
        return servicer.address

    def close(self) -> None:
        for server in self._servers:
            server.stop(None)
        self._servers.clear()
