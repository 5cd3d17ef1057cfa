"""Stream: the bidirectional delivery RPC. Records go out within the credit the client
grants (``stream_flow.py``); its acks and nacks come back on the same call and are answered
in order (``ack_rpcs.py``).

Each batch taken from the :class:`PartitionTable` goes out as ``Record`` messages, as
``RecordBatch`` columns (``DELIVERY_FORMAT_BATCHES``, wire bytes from ``wire.py``), or written
into the stream's shared-memory segment (``DELIVERY_FORMAT_ARROW_SHM``, ``shm_delivery.py``).

Redelivery (ARCHITECTURE §3 "Delivery"): what a Stream hands out is in flight with its holder
(the client id and this stream's id) until it is acked; a Stream that ends gives back what it
delivered and was not acked. With ``auto_ack``, records count as acked once written to the
client, never before. One stale ack is answered per record in its ``ack_result`` and never
ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc.aio
import structlog

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason, invalid
from dsclient.records import wire
from services.consumer_sidecar.ack_rpcs import AckOutcome, AckRpcs
from services.consumer_sidecar.acks import Holder
from services.consumer_sidecar.client_access import ClientMetrics
from services.consumer_sidecar.delivery_messages import (
    AUTO_ACK_MAX_BYTES,
    fits_any_client,
    records,
)
from services.consumer_sidecar.frame_socket import FrameConnection, FrameListener, check_open
from services.consumer_sidecar.request_checks import (
    MAX_ACKS,
    SHM_LOCAL_ONLY,
    check_caller,
    validate_acks,
    validate_credit,
    validate_delay,
    validate_format,
    validate_linger,
    validate_ranges,
)
from services.consumer_sidecar.serving import Serving
from services.consumer_sidecar.shm_delivery import (
    SharedMemory,
    has_room,
    open_segment,
    shared_limits,
    shared_response,
)
from services.consumer_sidecar.stream_flow import Credit, StreamState

log = structlog.get_logger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]

# Stream: one message holds at most this much, whatever the credit (Record messages, and
# the much cheaper RecordBatch columns).
STREAM_BATCH_RECORDS = 500
STREAM_BATCH_BYTES = 1024 * 1024
STREAM_COLUMNS_RECORDS = 10_000
STREAM_COLUMNS_BYTES = 4 * 1024 * 1024
# Stream: each waits on an event of its own, set when records were buffered or came due
# again (DataSignal), or for what its client sends; it looks again after this long only
# in case a way records become takeable does not signal (a missed signal costs this
# much, not a stall). It was 0.5 s while one event was shared and cleared by every reader.
STREAM_IDLE_SECONDS = 30.0


class StreamRpc:
    """The Stream RPC over ``serving``; its acks and nacks through ``acks``; ``clients``:
    the client-access metrics (None = not counted); ``shared_memory``: where
    ``DELIVERY_FORMAT_ARROW_SHM`` streams get their segments (None: refused);
    ``frames``: the frame socket of streams opened with ``frame_socket`` (None: refused)."""

    def __init__(
        self,
        serving: Serving,
        acks: AckRpcs,
        clients: ClientMetrics | None = None,
        shared_memory: SharedMemory | None = None,
        frames: FrameListener | None = None,
    ) -> None:
        self.serving = serving
        self.acks = acks
        self.clients = clients
        self.shared_memory = shared_memory
        self.frames = frames
        self._stream_ids = itertools.count(1)  # a Stream's holder id (0: Fetch)

    async def stream(
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], context: Context
    ) -> AsyncGenerator[stream_pb2.StreamResponse | bytes, None]:
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "open":
            raise invalid("open", "the first Stream message must be open")
        opened = first.open
        check_caller(opened.client_id, opened.group, self.serving.group)
        validate_credit("open.initial_credit", opened.initial_credit)
        delivery = validate_format("open.format", opened.format)
        linger = validate_linger("open.linger", opened)
        shared = delivery == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
        if shared and (self.shared_memory is None or not context.peer().startswith("unix:")):
            raise invalid("open.format", SHM_LOCAL_ONLY)
        if opened.frame_socket:
            check_open(self.frames, context.peer())
        if not self.serving.has_joined():
            raise DsError(Reason.SERVICE_NOT_READY, "sidecar has not joined the assigner yet")
        credit = Credit()
        credit.add(opened.initial_credit.records, opened.initial_credit.bytes)
        columns = delivery == stream_pb2.DELIVERY_FORMAT_BATCHES
        state = StreamState(
            credit=credit,
            auto_ack=opened.auto_ack,
            columns=columns,
            client_id=opened.client_id,
            linger=linger,
            hold_answers=opened.answers_with_batches,
        )
        if shared:
            assert self.shared_memory is not None
            state.segment = await open_segment(self.shared_memory, self.serving.sidecar_id)
        if state.segment is not None:
            limits = shared_limits(state.segment.ring.capacity)
        elif columns:
            limits = (STREAM_COLUMNS_RECORDS, STREAM_COLUMNS_BYTES)
        else:
            limits = (STREAM_BATCH_RECORDS, STREAM_BATCH_BYTES)
        if opened.auto_ack and state.segment is None:
            # A message every client accepts (issue 37, finding 8, as Fetch's).
            limits = (limits[0], min(limits[1], AUTO_ACK_MAX_BYTES))
        holder: Holder = (opened.client_id, next(self._stream_ids))
        self.serving.data.add_waiter(state.data)
        readers: list[asyncio.Task[None]] = []
        frames: FrameConnection | None = None
        clients = self.clients
        client_label = clients.stream_opened(opened.client_id) if clients is not None else ""
        if clients is not None and state.segment is not None:
            clients.shared_memory(client_label, state.segment.ring.capacity)
        loop = asyncio.get_running_loop()
        try:
            if opened.frame_socket:
                assert self.frames is not None
                token = await self.frames.open()
                yield stream_pb2.StreamResponse(
                    frame_socket=stream_pb2.FrameSocket(name=self.frames.path.name, token=token)
                )
                frames = await self.frames.attached(token)
                if clients is not None:
                    clients.frame_stream(client_label, 1)
                readers.append(asyncio.create_task(self.read_requests(frames.requests(), state)))
                readers.append(asyncio.create_task(_call_ends(request_iterator, state)))
            else:
                readers.append(asyncio.create_task(self.read_requests(request_iterator, state)))
            while True:
                state.wake.clear()
                if state.hold_due(loop.time()):
                    state.flush_held()
                while state.results:
                    if frames is None:
                        yield state.results.popleft()
                    else:
                        await frames.send(state.results.popleft())
                    state.drained()
                if state.error is not None:
                    raise state.error
                if state.ended:
                    return
                if state.pending:  # ARROW_SHM: taken, waiting for room in the segment
                    response, sent = shared_response(state)
                    if not sent:
                        await self._wait(state, data=False)  # for a release
                        continue
                    answers = state.take_held()
                    response.batch.ack_results.extend(answers)
                    if frames is None:
                        yield response
                    else:
                        await frames.send(response)
                    if answers:
                        state.drained()
                    if state.auto_ack:
                        self.serving.written(sent)
                    continue
                if not state.credit.available():
                    await self._wait(state, data=False)
                    continue
                if state.segment is not None and not has_room(state.segment.ring, limits):
                    # Records taken and held back for a client that holds its segment full
                    # would wait out the visibility timeout instead of going to another.
                    await self._wait(state, data=False)  # for a release
                    continue
                if state.linger and await self._lingered(state, limits):
                    continue
                state.data.clear()
                taken = self.serving.take(*state.credit.limits(*limits), holder)
                if not taken:
                    await self._wait(state, data=True)
                    continue
                if state.linger:
                    state.next_send_at = loop.time() + state.linger
                state.credit.spend(sum(map(len, taken)), sum(s.data_bytes() for s in taken))
                if state.segment is not None:
                    if clients is not None:
                        clients.delivered(opened.client_id, taken, acked=state.auto_ack)
                    state.pending = taken  # written into the segment as it has room
                    continue
                answers = state.take_held()  # answers to earlier acks ride on the batch
                message: stream_pb2.StreamResponse | bytes = (
                    wire.stream_response(taken, [a.SerializeToString() for a in answers])
                    if state.columns
                    else stream_pb2.StreamResponse(
                        batch=stream_pb2.StreamBatch(records=records(taken), ack_results=answers)
                    )
                )
                # A message some client refuses unseen (one record larger than 4 MiB) is
                # not auto-acked: a client refuses it after the sidecar wrote it whole (a
                # grown flow-control window), so "written" would ack what never arrived
                # (issue 37, finding 8, on Stream). Its records stay in flight and come
                # again when the stream ends.
                acked = state.auto_ack and fits_any_client(message)
                if clients is not None:
                    clients.delivered(opened.client_id, taken, acked=acked)
                if frames is None:
                    yield message
                else:
                    await frames.send(message)
                if answers:
                    state.drained()
                if acked:  # written (the generator resumes once it was sent)
                    self.serving.written(taken)
        except ConnectionError:
            if frames is None:
                raise
            # The client closed its frame socket while a frame went: the stream ends.
            log.info("stream's frame socket closed by the client", client=opened.client_id)
        finally:
            # Records delivered on this stream and not acked come again now (redelivery
            # as soon as the stream that received them ends); acks on the Ack RPC still
            # count for them until they are delivered again.
            for reader in readers:
                reader.cancel()
            for reader in readers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            if frames is not None:
                frames.close()
                if clients is not None:
                    clients.frame_stream(client_label, -1)
            self.serving.data.drop(state.data)
            if state.segment is not None:
                state.segment.close()
                if clients is not None:
                    clients.shared_memory(client_label, -state.segment.ring.capacity)
            self.serving.release(holder)
            if clients is not None:
                clients.stream_closed(client_label)

    async def read_requests(
        self, request_iterator: AsyncIterator[stream_pb2.StreamRequest], state: StreamState
    ) -> None:
        """The client's messages after ``open``: credit, acks (with the segment regions it
        released) and nacks, applied as they come; an error ends the stream with it."""
        try:
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "credit":
                    validate_credit("credit", request.credit)
                    state.credit.add(request.credit.records, request.credit.bytes)
                elif kind == "acks":
                    validate_acks("acks.acks", request.acks.acks)
                    validate_ranges("acks.ranges", request.acks.ranges)
                    if len(request.acks.released) > MAX_ACKS:
                        raise invalid("acks.released", f"at most {MAX_ACKS} per message")
                    if state.segment is not None and request.acks.released:
                        state.segment.release(request.acks.released)
                        state.wake.set()  # room in the segment
                    outcome = self.acks.apply_acks(
                        state.client_id, request.acks.acks, request.acks.ranges
                    )
                    # Answered once committed, by a task of its own: credits that arrive
                    # meanwhile are not held up behind the commit's round trip.
                    state.unanswered += 1
                    state.answering = asyncio.create_task(
                        self._answer_acks(state, request.acks, outcome, state.answering)
                    )
                elif kind == "nacks":
                    nacks = request.nacks
                    validate_acks("nacks.records", nacks.records)
                    validate_ranges("nacks.ranges", nacks.ranges)
                    delay = validate_delay("nacks.delay", nacks)
                    done = self.acks.apply_nacks(
                        state.client_id, nacks.records, nacks.ranges, delay
                    )
                    result = stream_pb2.StreamNackResult(
                        nacked_count=done.nacked,
                        rejected_acks=done.rejected,
                        rejected_ranges=done.rejected_ranges,
                        records=done.records,
                    )
                    state.results.append(stream_pb2.StreamResponse(nack_result=result))
                elif kind == "open":
                    raise invalid("open", "a Stream is opened once")
                else:
                    raise invalid("kind", "set one of open, credit, acks, nacks")
                if state.looks_again_for(kind):
                    state.wake.set()
                # A client that sends without reading its answers: read nothing more from
                # it until it has (issue 37, finding 11); its sends wait on flow control.
                await state.wait_for_room()
        except DsError as err:
            state.error = err
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as err:  # a bug: the stream fails (INTERNAL), never ends quietly
            log.exception("stream request failed")
            state.error = err
        finally:
            if state.answering is not None:  # the answers to acks already made
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(state.answering)
            state.ended = True
            state.wake.set()

    async def _answer_acks(
        self,
        state: StreamState,
        acks: stream_pb2.StreamAcks,
        outcome: AckOutcome,
        previous: asyncio.Task[None] | None,
    ) -> None:
        """Commit what ``outcome`` accepted, then queue its StreamAckResult after the
        previous acks' answer (whose commit this one's may already cover); acks whose
        commit could not be made are refused. A commit that fails ends the stream with its
        status, as before an answer."""
        try:
            try:
                if outcome.accepted:
                    outcome = outcome.refused(await self.serving.commit_acked(outcome.touched))
            except DsError as err:
                state.error = state.error or err
            self.acks.count_acks(state.client_id, acks.acks, acks.ranges, outcome)
            if previous is not None:
                await previous
            if state.error is not None:
                state.wake.set()
                return
            result = outcome.result()
            now = asyncio.get_running_loop().time()
            if state.answer(result, acks.answer_now, now):
                state.wake.set()
        finally:
            state.unanswered -= 1
            state.room.set()  # an error ends the stream: the reader must not wait for room

    async def _lingered(self, state: StreamState, limits: tuple[int, int]) -> bool:
        """With a linger: the last batch went out less than the linger ago and less than a
        whole batch is buffered; wait for the rest of it, or until more records are
        buffered (looked at again) or the client sends something (its acks are answered
        meanwhile). True if it waited."""
        left = state.next_send_at - asyncio.get_running_loop().time()
        if left <= 0 or self.serving.holds_at_least(*state.credit.limits(*limits)):
            return False
        await self._wait(state, data=True, timeout=left, fresh=True)
        return True

    async def _wait(
        self,
        state: StreamState,
        *,
        data: bool,
        timeout: float = STREAM_IDLE_SECONDS,
        fresh: bool = False,
    ) -> None:
        """Until the client sent something, or (with ``data``) records were buffered, or
        ``timeout``: one wait on ``state.wake``, which the data event sets too while it is
        wanted. ``fresh``: what is buffered now was looked at; wake only for what comes
        next. Held answers wait only for records: waiting for the client, they go now."""
        if state.held and not data:
            # No batch can go until the client acts (credit, a release), and it may be
            # waiting for these answers first (ack_nowait's thread sends its next acks
            # after them): they go now, on their own.
            state.flush_held()
            return
        if data:
            if fresh:
                state.data.clear()
            elif state.data.is_set():
                return
            state.data.wanted = True
        timeout = state.wait_limit(timeout, asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(timeout) as waiting:
                state.waiting, state.waiting_for_data = waiting, data
                await state.wake.wait()
        except TimeoutError:
            pass
        finally:
            state.waiting = None
            state.data.wanted = False


async def _call_ends(
    request_iterator: AsyncIterator[stream_pb2.StreamRequest], state: StreamState
) -> None:
    """A stream on its frame socket: the gRPC call's end (the client half-closed, or went)
    ends it too; a message sent on the call instead of the socket fails it."""
    try:
        async for request in request_iterator:
            kind = request.WhichOneof("kind")
            state.error = state.error or invalid(
                kind or "kind", "a stream on its frame socket sends its messages there"
            )
            break
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass
    finally:
        state.ended = True
        state.wake.set()
