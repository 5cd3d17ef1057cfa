"""One bound sidecar: its channel, and the Fetch and Stream calls whose responses are
read in place (``dsclient/records/wire.py``) rather than parsed into protobuf messages."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.batch import Batch, batch_of, received
from dsclient.records import wire

log = logging.getLogger(__name__)

_SERVICE = f"/{stream_pb2.DESCRIPTOR.services_by_name['StreamService'].full_name}/"


@dataclass(frozen=True)
class Fetched:
    """A Fetch response that says something of the acks the client carried in fetches
    (``FetchResponse.acks``): its batch, and that."""

    batch: Batch
    acks: stream_pb2.FetchAckAnswers


def fetched(data: bytes) -> Batch | Fetched:
    """A Fetch response as a Batch: its RecordBatches read in place (``wire.py``), anything
    else (an older sidecar's Record messages, headers) parsed by protobuf; with what it
    says of carried acks (``acks``), as :class:`Fetched`."""
    answers: list[bytes] = []
    columns = wire.parse_batches(data, answers=answers)
    if columns is None:
        response = stream_pb2.FetchResponse.FromString(data)
        batch = received(response)
        return Fetched(batch, response.acks) if response.HasField("acks") else batch
    if not answers:
        return batch_of(columns)
    return Fetched(batch_of(columns), stream_pb2.FetchAckAnswers.FromString(answers[-1]))


@dataclass(frozen=True)
class Answered:
    """A batch read in place and the answers to earlier acks it carried
    (``StreamBatch.ack_results``, on a stream opened with ``answers_with_batches``)."""

    item: Batch | list[wire.BatchFields]
    answers: list[stream_pb2.StreamAckResult]


Read = TypeVar("Read", Batch, list[wire.BatchFields])


def _answered(item: Read, answers: list[bytes]) -> Read | Answered:
    if not answers:
        return item
    return Answered(item, [stream_pb2.StreamAckResult.FromString(a) for a in answers])


def streamed_columns(
    data: bytes,
) -> list[wire.BatchFields] | Answered | stream_pb2.StreamResponse:
    """A Stream response for columns: a batch of RecordBatches only as their fields, views
    of ``data`` (``wire.stream_batch_fields``: turned into Arrow without a copy), with the
    ack answers it carries; anything else (shared batches, an ack result, headers) as its
    message."""
    answers: list[bytes] = []
    fields = wire.stream_batch_fields(data, answers)
    if fields is None:
        return stream_pb2.StreamResponse.FromString(data)
    return _answered(fields, answers)


def streamed(data: bytes) -> Batch | Answered | stream_pb2.StreamResponse:
    """A Stream response: a batch as a Batch (read like :func:`fetched`) with the ack
    answers it carries, an ack result as its message."""
    answers: list[bytes] = []
    columns = wire.parse_stream_batch(data, answers)
    if columns is None:
        return stream_pb2.StreamResponse.FromString(data)
    return _answered(batch_of(columns), answers)


@dataclass
class Sidecar:
    """A bound sidecar: its channel, its calls, and the partitions the binding says it
    serves. ``address`` (TCP ``HOST:PORT``) is its key; ``target`` is what the channel
    dials: ``address``, or the sidecar's socket in the pod (``local_address``, chosen by
    :func:`dsclient.transport.sidecar_target`). The channels are closed when a
    binding no longer names it."""

    address: str
    channel: grpc.Channel
    stub: stream_pb2_grpc.StreamServiceStub
    partitions: set[tuple[str, int]] = field(default_factory=set)
    target: str = ""  # default: address
    local_address: str = ""  # the unix: target the binding names; "" = none
    # Opens a channel to a target (dsclient.connection.open_channel, the one place
    # channels are made, with the client's settings): how fall_back reaches TCP.
    reopen: Callable[[str], grpc.Channel] | None = None
    # Whether its Fetch reads the acks a request carries (FetchRequest.ack_ranges): False
    # once a response did not name their ack_seq (a sidecar older than the field).
    reads_carried_acks: bool = True
    # Fetch and Stream with responses read by fetched and streamed.
    fetch: grpc.UnaryUnaryMultiCallable[stream_pb2.FetchRequest, Batch | Fetched] = field(
        init=False
    )
    stream: grpc.StreamStreamMultiCallable[
        stream_pb2.StreamRequest, Batch | stream_pb2.StreamResponse
    ] = field(init=False)
    # Stream with responses read by streamed_columns (stream_columns).
    stream_columns: grpc.StreamStreamMultiCallable[
        stream_pb2.StreamRequest, list[wire.BatchFields] | stream_pb2.StreamResponse
    ] = field(init=False)
    # Channels replaced by attach: calls still running on them finish there (closing one
    # would cancel them), so they are closed with the sidecar.
    _retired: list[grpc.Channel] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.target = self.target or self.address
        self._calls()

    def _calls(self) -> None:
        self.fetch = self.channel.unary_unary(
            _SERVICE + "Fetch",
            request_serializer=stream_pb2.FetchRequest.SerializeToString,
            response_deserializer=fetched,
        )
        self.stream = self.channel.stream_stream(
            _SERVICE + "Stream",
            request_serializer=stream_pb2.StreamRequest.SerializeToString,
            response_deserializer=streamed,
        )
        self.stream_columns = self.channel.stream_stream(
            _SERVICE + "Stream",
            request_serializer=stream_pb2.StreamRequest.SerializeToString,
            response_deserializer=streamed_columns,
        )

    @property
    def local(self) -> bool:
        """Whether the channel dials the sidecar's socket (not TCP)."""
        return self.target != self.address

    def records_call(
        self,
    ) -> tuple[
        str,
        grpc.StreamStreamMultiCallable[stream_pb2.StreamRequest, Batch | stream_pb2.StreamResponse],
    ]:
        """The target dialed now and the records' Stream call on that same channel."""
        with self._lock:
            return self.target, self.stream

    def columns_call(
        self,
    ) -> tuple[
        str,
        grpc.StreamStreamMultiCallable[
            stream_pb2.StreamRequest, list[wire.BatchFields] | stream_pb2.StreamResponse
        ],
    ]:
        """The target dialed now and the columns' Stream call on that same channel, taken
        together (a fall back may switch both meanwhile)."""
        with self._lock:
            return self.target, self.stream_columns

    def attach(self, channel: grpc.Channel, target: str) -> None:
        """Call the sidecar over ``channel`` (dialing ``target``) from now on."""
        with self._lock:
            if target == self.target:
                channel.close()
                return
            self._retired.append(self.channel)
            self.channel, self.target = channel, target
            self.stub = stream_pb2_grpc.StreamServiceStub(channel)
            self._calls()
        log.info("sidecar %s: transport %s", self.address, target)

    def fall_back(self) -> bool:
        """A call over the socket failed ``UNAVAILABLE``: use TCP from now on (until a
        binding names the socket again and it accepts). True if it switched."""
        if not self.local or self.reopen is None:
            return False
        self.attach(self.reopen(self.address), self.address)
        return True

    def close(self) -> None:
        """Close every channel of the sidecar (calls on them end ``CANCELLED``)."""
        with self._lock:
            channels, self._retired = [self.channel, *self._retired], []
        for channel in channels:
            channel.close()
