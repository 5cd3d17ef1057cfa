"""ReadRange and CommitOffsets: reads of an offset range outside the group's delivery, and
the commits bound to them.

ReadRange reads on its own consumers (``reader.py``, on the readers' threads) and never
moves the group's position; every chunk is read under this sidecar's live lease, and its
consumer and one chunk are reserved from the sidecar's read budget while it runs.
CommitOffsets commits on the fetch thread, fenced by epoch and bound to the client
ReadRange gave the records to under that epoch (``range_reads.py``): another client, or an
offset beyond what the caller was given, is refused per partition (NOT_HOLDER,
NOT_DELIVERED), and so is a stale epoch (by contract, never the whole call).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import grpc.aio
import structlog
from confluent_kafka import KafkaError, KafkaException

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason
from services.consumer_sidecar.client_access import ClientMetrics
from services.consumer_sidecar.lease_checks import lease_problem
from services.consumer_sidecar.lease_commits import ExplicitCommit
from services.consumer_sidecar.partitions import Partition
from services.consumer_sidecar.reader import (
    RangeOutOfRange,
    RangeRead,
    RangeReaders,
    RangeSpec,
    ReadStalled,
)
from services.consumer_sidecar.request_checks import (
    check_caller,
    validate_commits,
    validate_range,
)
from services.consumer_sidecar.serving import Serving
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")


class RangeRpcs:
    """The ReadRange and CommitOffsets RPCs over ``serving``, reading on ``readers``;
    ``clients``: the client-access metrics (None = not counted)."""

    def __init__(
        self, serving: Serving, readers: RangeReaders, clients: ClientMetrics | None = None
    ) -> None:
        self.serving = serving
        self.readers = readers  # ReadRange's consumers and watermark queries
        self.clients = clients

    # ---- ReadRange --------------------------------------------------------------------

    async def read_range(
        self, request: stream_pb2.ReadRangeRequest, context: Context
    ) -> AsyncGenerator[stream_pb2.ReadRangeResponse, None]:
        check_caller(request.client_id, request.group, self.serving.group)
        tp, max_bytes = validate_range(request)
        part = self._held(tp)
        epoch = part.epoch
        if request.to_offset == request.from_offset:
            yield stream_pb2.ReadRangeResponse(lease_epoch=epoch, next_offset=request.to_offset)
            return
        spec = RangeSpec(
            tp,
            request.from_offset,
            request.to_offset,
            max_bytes,
            epoch,
            arrow=request.format == stream_pb2.READ_FORMAT_ARROW_IPC,
        )
        reserved = self._reserve_read(max_bytes)
        try:
            read = await self._open(spec, request)
            start = request.from_offset  # where the next chunk's records begin
            try:
                while True:
                    chunk = await self._kafka(read.next_chunk, request=request)
                    if chunk is None:
                        raise DsError(Reason.SERVICE_NOT_READY, "the range read was stopped")
                    self._held(tp, epoch)  # every chunk is read under the live lease
                    if self.clients is not None:
                        self.clients.served_records(
                            request.client_id, chunk.count, chunk.payload_bytes
                        )
                    # Counted as given once handed to gRPC: the client may commit up to here.
                    self.serving.range_given(tp, epoch, request.client_id, start, chunk.next_offset)
                    start = chunk.next_offset
                    yield stream_pb2.ReadRangeResponse(
                        records=chunk.records,
                        arrow_ipc=chunk.arrow_ipc,
                        lease_epoch=epoch,
                        next_offset=chunk.next_offset,
                    )
                    if chunk.next_offset >= request.to_offset:
                        return
            finally:
                # Never blocks the loop: a read still consuming stops within one poll.
                self.readers.executor.submit(read.close)
        finally:
            self.serving.release_read(reserved)  # done, failed or cancelled alike

    def _reserve_read(self, max_bytes: int) -> int:
        """Reserve what a stream may hold (its consumer's prefetch and one chunk) from the
        sidecar's read budget, or RESOURCE_EXHAUSTED TOO_MANY_RANGE_READS."""
        needed = self.readers.prefetch_bytes + max_bytes
        refusal = self.serving.reserve_read(needed)
        if refusal is None:
            return needed
        budget = self.serving.read_budget
        raise DsError(
            Reason.TOO_MANY_RANGE_READS,
            refusal.message,
            metadata={
                "limit": refusal.limit,
                "open_streams": str(budget.streams),
                "max_streams": str(budget.max_streams),
                "reserved_bytes": str(budget.reserved),
                "needed_bytes": str(needed),
                "budget_bytes": str(budget.max_bytes),
            },
        )

    async def _open(self, spec: RangeSpec, request: stream_pb2.ReadRangeRequest) -> RangeRead:
        """Open the range's reader. A call cancelled meanwhile closes the reader once its
        opening is done (it runs on a reader thread and cannot be interrupted), so no
        consumer outlives the stream that reserved its memory."""
        opening = asyncio.ensure_future(self._kafka(self.readers.open, spec, request=request))
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._close_opened)
            raise

    def _close_opened(self, opening: asyncio.Future[RangeRead]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.readers.executor.submit(opening.result().close)

    def _held(self, tp: TP, epoch: int | None = None) -> Partition:
        """The partition if this sidecar holds its live lease (at ``epoch``), else
        FAILED_PRECONDITION LEASE_NOT_HELD. The holder is not known here: ask the assigner
        (DescribeGroup) or the client's binding."""
        part = self.serving.partition(tp)
        problem = lease_problem(part, self.serving.now(), epoch)
        if problem is None and part is not None:
            return part
        reason, message = problem or (stream_pb2.REJECT_REASON_NOT_HELD, "not held")
        raise DsError(
            Reason.LEASE_NOT_HELD,
            f"{tp.topic}[{tp.partition}]: {message}",
            metadata={
                "group": self.serving.group,
                "topic": tp.topic,
                "partition": str(tp.partition),
                "sidecar_id": self.serving.sidecar_id,
                "state": stream_pb2.RejectReason.Name(reason).removeprefix("REJECT_REASON_"),
                "current_epoch": str(part.epoch if part is not None else -1),
            },
        )

    async def _kafka(
        self, fn: Callable[..., R], *args: Any, request: stream_pb2.ReadRangeRequest
    ) -> R:
        """Run blocking Kafka work on the readers' threads; its failures as statuses."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.readers.executor, fn, *args)
        except RangeOutOfRange as exc:
            raise DsError(
                Reason.OFFSET_OUT_OF_RANGE,
                f"[{request.from_offset}, {request.to_offset}) is outside "
                f"{request.topic}[{request.partition}]: {exc}",
                metadata={
                    "topic": request.topic,
                    "partition": str(request.partition),
                    "from_offset": str(request.from_offset),
                    "to_offset": str(request.to_offset),
                    "log_start_offset": str(exc.low),
                    "high_watermark": str(exc.high),
                },
            ) from exc
        except ReadStalled as exc:
            raise DsError(Reason.KAFKA_UNAVAILABLE, str(exc)) from exc
        except KafkaException as exc:
            raise _kafka_error(exc, request.topic, request.partition) from exc

    # ---- CommitOffsets ----------------------------------------------------------------

    async def commit_offsets(
        self, request: stream_pb2.CommitOffsetsRequest
    ) -> stream_pb2.CommitOffsetsResponse:
        check_caller(request.client_id, request.group, self.serving.group)
        validate_commits(request)
        results: list[stream_pb2.OffsetCommitResult | None] = [None] * len(request.offsets)
        to_commit: list[tuple[int, ExplicitCommit]] = []
        for index, commit in enumerate(request.offsets):
            beyond = await self._beyond_high_watermark(commit)
            if beyond is not None:
                results[index] = stream_pb2.OffsetCommitResult(
                    commit=commit,
                    reason=stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
                    message=beyond,
                )
            else:
                tp = TP(commit.topic, commit.partition)
                to_commit.append((index, ExplicitCommit(tp, commit.offset, commit.lease_epoch)))
        outcomes = await self.serving.commit_offsets([c for _, c in to_commit], request.client_id)
        for (index, _), outcome in zip(to_commit, outcomes, strict=True):
            results[index] = stream_pb2.OffsetCommitResult(
                commit=request.offsets[index],
                committed=outcome.committed,
                reason=outcome.reason,
                message=outcome.message,
            )
        return stream_pb2.CommitOffsetsResponse(results=[r for r in results if r is not None])

    async def _beyond_high_watermark(self, commit: stream_pb2.OffsetCommit) -> str | None:
        """Why the offset is past the partition's high watermark, or None. The watermark
        from statistics may be old, so one above it is checked against Kafka itself."""
        part = self.serving.partition(TP(commit.topic, commit.partition))
        if part is None:
            return None  # refused as NOT_HELD by the keeper
        if 0 <= commit.offset <= part.high_watermark:
            return None
        loop = asyncio.get_running_loop()
        try:
            _low, high = await loop.run_in_executor(
                self.readers.executor, self.readers.watermarks, part.tp
            )
        except KafkaException as exc:
            log.info("watermark query failed; not checking the range", error=str(exc))
            return None
        if commit.offset > high:
            return f"offset {commit.offset} is beyond the high watermark {high}"
        return None


def _kafka_error(exc: KafkaException, topic: str, partition: int) -> DsError:
    error = exc.args[0] if exc.args else None
    unknown = (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    )
    if isinstance(error, KafkaError) and error.code() in unknown:
        return DsError(
            Reason.TOPIC_NOT_FOUND,
            f"{topic}[{partition}] does not exist in Kafka",
            metadata={"topic": topic, "partition": str(partition)},
        )
    return DsError(Reason.KAFKA_UNAVAILABLE, f"kafka: {exc}")
