"""StreamService servicer: each RPC handed to the module that serves it, and the service
registered on a gRPC server.

The servicer is given a :class:`Serving` (``serving.py``: delivery from the partition
table, acks and commits of the lease keeper, this sidecar's group and id) and the range
readers, not the sidecar. The RPCs are served by:

* ``fetch_rpc.py``: Fetch;
* ``ack_rpcs.py``: Ack and Nack (and a Stream's acks and nacks);
* ``stream_rpc.py``: Stream, within the client's credit (``stream_flow.py``), zero-copy
  delivery over shared memory in ``shm_delivery.py``;
* ``range_rpcs.py``: ReadRange and CommitOffsets;
* ``status_rpc.py``: Status;

each checking its requests with ``request_checks.py``. Delivery (Fetch and Stream) may answer
wire bytes written straight from the column chunks (``dsclient/records/wire.py``):
:func:`add_to_server` registers the service with a serializer that passes them through.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
from google.protobuf import message_factory
from google.protobuf.message import Message

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.ack_rpcs import AckRpcs
from services.consumer_sidecar.client_access import ClientMetrics
from services.consumer_sidecar.fetch_rpc import FetchRpc
from services.consumer_sidecar.frame_socket import FrameListener
from services.consumer_sidecar.range_rpcs import RangeRpcs
from services.consumer_sidecar.reader import RangeReaders
from services.consumer_sidecar.serving import Serving
from services.consumer_sidecar.shm_delivery import SharedMemory
from services.consumer_sidecar.status_rpc import status_response
from services.consumer_sidecar.stream_rpc import StreamRpc
from services.runtime.handlers import method_handler

Context = grpc.aio.ServicerContext[Any, Any]


class StreamServicer(stream_pb2_grpc.StreamServiceServicer):
    def __init__(
        self,
        serving: Serving,
        readers: RangeReaders,
        clients: ClientMetrics | None = None,
        shared_memory: SharedMemory | None = None,
        frames: FrameListener | None = None,
    ) -> None:
        self.serving = serving
        self.readers = readers  # ReadRange's consumers and watermark queries
        self.acks = AckRpcs(serving, clients)
        self.fetches = FetchRpc(serving, clients, self.acks)
        # shared_memory None: DELIVERY_FORMAT_ARROW_SHM is refused
        # frames None: StreamOpen.frame_socket is refused
        self.streams = StreamRpc(serving, self.acks, clients, shared_memory, frames)
        self.ranges = RangeRpcs(serving, readers, clients)

    def close(self) -> None:
        self.readers.close()

    async def Fetch(  # type: ignore[override]
        self, request: stream_pb2.FetchRequest, context: Context
    ) -> stream_pb2.FetchResponse | bytes:
        return await self.fetches.fetch(request, context)

    async def Ack(self, request: stream_pb2.AckRequest, context: Context) -> stream_pb2.AckResponse:
        return await self.acks.ack(request)

    async def Nack(
        self, request: stream_pb2.NackRequest, context: Context
    ) -> stream_pb2.NackResponse:
        return self.acks.nack(request)

    async def Stream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], context: Context
    ) -> AsyncIterator[stream_pb2.StreamResponse | bytes]:
        # Closed as soon as the call ends (its finally gives back what it delivered).
        async with contextlib.aclosing(self.streams.stream(request_iterator, context)) as out:
            async for response in out:
                yield response

    async def ReadRange(
        self, request: stream_pb2.ReadRangeRequest, context: Context
    ) -> AsyncIterator[stream_pb2.ReadRangeResponse]:
        async with contextlib.aclosing(self.ranges.read_range(request, context)) as out:
            async for response in out:
                yield response

    async def CommitOffsets(
        self, request: stream_pb2.CommitOffsetsRequest, context: Context
    ) -> stream_pb2.CommitOffsetsResponse:
        return await self.ranges.commit_offsets(request)

    async def Status(
        self, request: stream_pb2.StatusRequest, context: Context
    ) -> stream_pb2.StatusResponse:
        return status_response(self.serving)


def _serialize(response: Message | bytes) -> bytes:
    """A response message, or one already encoded (``wire.py``), as wire bytes."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_to_server(servicer: StreamServicer, server: grpc.aio.Server) -> None:
    """Register StreamService as ``stream_pb2_grpc.add_StreamServiceServicer_to_server``
    does (every method of the proto's service, by its descriptor), except that any
    response may be wire bytes already."""
    service = stream_pb2.DESCRIPTOR.services_by_name["StreamService"]
    handlers = {}
    for method in service.methods:
        handlers[method.name] = method_handler(
            getattr(servicer, method.name),
            request_streaming=method.client_streaming,
            response_streaming=method.server_streaming,
            request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=_serialize,
        )
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    # As the generated code does (grpcio >= 1.63; not in the grpc-stubs).
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]
