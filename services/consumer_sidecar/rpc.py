"""StreamService servicer: Fetch (long-poll), Ack and Status.

Stream, ReadRange and CommitOffsets are part of the API (protos) and answer UNIMPLEMENTED
until the sidecar issue builds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc.aio
from google.protobuf import duration_pb2

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.runtime.errors import DsError, Reason, invalid, not_implemented

if TYPE_CHECKING:
    from services.consumer_sidecar.app import SidecarApp

Context = grpc.aio.ServicerContext[Any, Any]

DEFAULT_MAX_RECORDS = 500
MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_WAIT = 0.5
MAX_WAIT = 30.0
MAX_ACKS = 100_000


class StreamServicer(stream_pb2_grpc.StreamServiceServicer):
    def __init__(self, app: SidecarApp) -> None:
        self.app = app

    def _check_caller(self, client_id: str, group: str) -> None:
        if not client_id:
            raise invalid("client_id", "must not be empty")
        if not group:
            raise invalid("group", "must not be empty")
        if group != self.app.settings.group:
            raise DsError(
                Reason.GROUP_NOT_SERVED,
                f"this sidecar serves group {self.app.settings.group!r}, not {group!r}",
                metadata={"group": group, "served_group": self.app.settings.group},
            )

    async def Fetch(
        self, request: stream_pb2.FetchRequest, context: Context
    ) -> stream_pb2.FetchResponse:
        self._check_caller(request.client_id, request.group)
        max_records = request.max_records or DEFAULT_MAX_RECORDS
        if not 0 < max_records <= MAX_RECORDS:
            raise invalid("max_records", f"must be between 0 and {MAX_RECORDS}")
        max_bytes = request.max_bytes or DEFAULT_MAX_BYTES
        if not 0 < max_bytes <= MAX_BYTES:
            raise invalid("max_bytes", f"must be between 0 and {MAX_BYTES}")
        max_wait = (
            request.max_wait.ToTimedelta().total_seconds()
            if request.HasField("max_wait")
            else DEFAULT_MAX_WAIT
        )
        if not 0 <= max_wait <= MAX_WAIT:
            raise invalid("max_wait", f"must be between 0 and {MAX_WAIT:.0f} s")
        if not self.app.session.connected and not self.app.table.snapshot():
            raise DsError(Reason.SERVICE_NOT_READY, "sidecar has not joined the assigner yet")
        deadline = time.monotonic() + max_wait
        while True:
            taken = self.app.table.take(max_records, max_bytes)
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                break
            self.app.data_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.app.data_ready.wait(), remaining)
        if request.auto_ack:
            for part, record in taken:
                part.acks.ack(record.offset)
        return stream_pb2.FetchResponse(records=[record for _, record in taken])

    async def Ack(self, request: stream_pb2.AckRequest, context: Context) -> stream_pb2.AckResponse:
        self._check_caller(request.client_id, request.group)
        if not request.acks:
            raise invalid("acks", "name at least one record")
        if len(request.acks) > MAX_ACKS:
            raise invalid("acks", f"at most {MAX_ACKS} per call")
        rejected = []
        for ack in request.acks:
            if ack.offset < 0:
                raise invalid("acks.offset", "must be >= 0")
            problem = self.app.keeper.ack(ack)
            if problem is not None:
                rejected.append(problem)
        return stream_pb2.AckResponse(
            acked_count=len(request.acks) - len(rejected), rejected_acks=rejected
        )

    async def Stream(
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], context: Context
    ) -> AsyncIterator[stream_pb2.StreamResponse]:
        await not_implemented(context, "StreamService.Stream")
        yield stream_pb2.StreamResponse()  # pragma: no cover - makes this a stream handler

    async def ReadRange(
        self, request: stream_pb2.ReadRangeRequest, context: Context
    ) -> AsyncIterator[stream_pb2.ReadRangeResponse]:
        await not_implemented(context, "StreamService.ReadRange")
        yield stream_pb2.ReadRangeResponse()  # pragma: no cover - makes this a stream handler

    async def CommitOffsets(
        self, request: stream_pb2.CommitOffsetsRequest, context: Context
    ) -> stream_pb2.CommitOffsetsResponse:
        await not_implemented(context, "StreamService.CommitOffsets")

    async def Status(
        self, request: stream_pb2.StatusRequest, context: Context
    ) -> stream_pb2.StatusResponse:
        now = time.monotonic()
        partitions = []
        for part in sorted(self.app.table.snapshot(), key=lambda p: p.tp):
            remaining = duration_pb2.Duration()
            remaining.FromNanoseconds(int(max(0.0, part.deadline - now) * 1e9))
            partitions.append(
                stream_pb2.PartitionStatus(
                    topic=part.tp.topic,
                    partition=part.tp.partition,
                    lease_epoch=part.epoch,
                    lease_deadline_remaining=remaining,
                    position=part.position,
                    committed_offset=part.committed,
                    high_watermark=part.high_watermark,
                    buffered_records=len(part.buffer),
                    buffered_bytes=part.buffered_bytes,
                    paused=part.paused,
                    inflight=part.acks.inflight,
                )
            )
        return stream_pb2.StatusResponse(
            sidecar_id=self.app.settings.id,
            group=self.app.settings.group,
            partitions=partitions,
            buffer_bytes=self.app.table.buffered_bytes,
            buffer_cap_bytes=self.app.table.buffer_max_bytes,
            consumer_config=self.app.effective_config(),
            assigner_connected=self.app.session.connected,
        )
