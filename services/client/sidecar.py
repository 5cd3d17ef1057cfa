"""One bound sidecar: its channel, and the Fetch and Stream calls whose responses are
read in place (``services/records/wire.py``) rather than parsed into protobuf messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.client.batch import Batch, batch_of, received
from services.records import wire

_SERVICE = f"/{stream_pb2.DESCRIPTOR.services_by_name['StreamService'].full_name}/"


def fetched(data: bytes) -> Batch:
    """A Fetch response as a Batch: its RecordBatches read in place (``wire.py``), anything
    else (an older sidecar's Record messages, headers) parsed by protobuf."""
    columns = wire.parse_batches(data)
    if columns is None:
        return received(stream_pb2.FetchResponse.FromString(data))
    return batch_of(columns)


def streamed(data: bytes) -> Batch | stream_pb2.StreamResponse:
    """A Stream response: a batch as a Batch (read like :func:`fetched`), an ack result
    as its message."""
    columns = wire.parse_stream_batch(data)
    if columns is None:
        return stream_pb2.StreamResponse.FromString(data)
    return batch_of(columns)


@dataclass
class Sidecar:
    """A bound sidecar: its channel, its calls, and the partitions the binding says it
    serves. The channel is closed when a binding no longer names it."""

    address: str
    channel: grpc.Channel
    stub: stream_pb2_grpc.StreamServiceStub
    partitions: set[tuple[str, int]] = field(default_factory=set)
    # Fetch and Stream with responses read by fetched and streamed.
    fetch: grpc.UnaryUnaryMultiCallable[stream_pb2.FetchRequest, Batch] = field(init=False)
    stream: grpc.StreamStreamMultiCallable[
        stream_pb2.StreamRequest, Batch | stream_pb2.StreamResponse
    ] = field(init=False)

    def __post_init__(self) -> None:
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
