"""The ``Stream`` RPC reader: one credit-based stream per bound sidecar, on its own thread.

The application's thread only takes what the streams put on a queue and grants credit
back as it takes it; acks may go on the stream that delivered the records and are answered
in order, so a stream that breaks fails its pending acks and the caller falls back to the
``Ack`` RPC.

A stream opened for columns (``stream_columns``) asks for ``DELIVERY_FORMAT_ARROW_SHM``
when its sidecar is reached over the local socket, and reads each ``SharedBatch`` in place
from the segment mapped for that opening (:mod:`dsclient.shared`); over TCP it asks
for ``DELIVERY_FORMAT_BATCHES`` and turns each RecordBatch into Arrow columns. A sidecar
that refuses the shared-memory format (``INVALID_ARGUMENT`` on ``open.format``: one without
it), or a shared batch the client cannot read (its segment not visible here), makes the
stream re-open with ``BATCHES`` for good; the sidecar delivers again what the ended stream
had delivered and was not acked.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, cast

import grpc

from dataservice.sidecar.v1 import stream_pb2
from dsclient.batch import Batch, Span, accepted_spans, received
from dsclient.columns import ColumnBatch, Release, regions_of
from dsclient.errors import ClientError
from dsclient.frame_socket import FrameSocket, FrameSocketError
from dsclient.local_socket import path_of
from dsclient.reasons import error_info
from dsclient.records import wire
from dsclient.shared import Segments, SharedBatchError
from dsclient.sidecar import Answered, Sidecar, streamed, streamed_columns

if TYPE_CHECKING:
    # pyarrow is the ``arrow`` extra's: imported when a columns stream builds its first
    # columns, not with the client.
    import pyarrow as pa

log = logging.getLogger(__name__)

Item = Batch | ColumnBatch | ClientError
# What a Stream call yields: a records stream's batches (Batch) or a columns stream's
# RecordBatches (their fields), and every other response as its message.
# A batch read in place may come with the answers to earlier acks (Answered).
Response = Batch | list[wire.BatchFields] | Answered | stream_pb2.StreamResponse


def columns_of_batches(message: stream_pb2.StreamBatch) -> ColumnBatch:
    """A StreamBatch's RecordBatches, parsed by protobuf, as Arrow columns (the key and
    value columns point into the message's bytes), one record batch and span each: the
    oversize runs of an ARROW_SHM response (a plain BATCHES response is read by
    :func:`columns_of_fields` without protobuf).

    Raises:
        ClientError: The sidecar sent Record messages (it predates ``BATCHES``).
    """
    if message.records:
        raise ClientError("the sidecar sent Record messages: it cannot deliver columns")
    from dsclient.records.arrow_batches import from_message

    return _columns(
        (rb.topic, rb.partition, rb.lease_epoch, rb.delivery_count, rb.offsets, from_message(rb))
        for rb in message.batches
        if rb.offsets
    )


def columns_of_fields(fields: list[wire.BatchFields]) -> ColumnBatch:
    """RecordBatches read from the received bytes (``wire.stream_batch_fields``) as Arrow
    columns: their key and value columns are views of those bytes (no copy)."""
    from dsclient.records.arrow_batches import record_batch

    return _columns(
        (
            f.topic,
            f.partition,
            f.lease_epoch,
            f.delivery_count,
            f.offsets,
            record_batch(
                f.topic,
                f.partition,
                f.offsets,
                f.timestamps or None,
                f.value_lengths,
                f.values,
                f.key_lengths or None,
                f.keys,
            ),
        )
        for f in fields
        if f.offsets
    )


def _columns(
    runs: Iterable[tuple[str, int, int, int, bytes | memoryview, pa.RecordBatch]],
) -> ColumnBatch:
    """Runs (topic, partition, lease epoch, delivery count, packed offsets, their Arrow
    columns) as one ColumnBatch, a span each from its first and last offset."""
    batches, spans, deliveries = [], [], []
    for topic, partition, epoch, delivery_count, offsets, columns in runs:
        first = int.from_bytes(offsets[:8], "little", signed=True)
        last = int.from_bytes(offsets[-8:], "little", signed=True)
        spans.append(Span(topic, partition, epoch, first, last + 1, len(offsets) // 8))
        batches.append(columns)
        deliveries.append(delivery_count)
    return ColumnBatch(batches, spans, delivery_counts=deliveries)


def columns_of(
    message: stream_pb2.StreamBatch,
    segments: Segments | None,
    stream: Hashable,
    generation: int,
) -> ColumnBatch:
    """A StreamBatch as columns: its shared runs read in place from ``segments`` (their
    regions to be released on ``stream``'s ``generation``), then its RecordBatches (a run
    too large for the segment comes that way) turned into columns.

    Raises:
        SharedBatchError: A shared run cannot be read (``segments`` None: none expected).
        ClientError: As :func:`columns_of_batches`.
    """
    copied = columns_of_batches(message)
    if not message.shared:
        return copied
    if segments is None:
        raise SharedBatchError("a SharedBatch on a stream that did not ask for ARROW_SHM")
    records = [segments.read(shared) for shared in message.shared]
    spans = [
        Span(s.topic, s.partition, s.lease_epoch, s.first_offset, s.last_offset + 1, s.record_count)
        for s in message.shared
    ]
    regions = tuple(s.region for s in message.shared)
    return ColumnBatch(
        [*records, *copied.record_batches],
        [*spans, *copied.spans],
        [Release(stream, generation, regions)],
        [*(s.delivery_count for s in message.shared), *copied.delivery_counts],
    )


def _refused_field(error: grpc.RpcError) -> str | None:
    """The field an INVALID_ARGUMENT names (its ErrorInfo), else None."""
    if error.code() is not grpc.StatusCode.INVALID_ARGUMENT:
        return None
    info = error_info(error)
    return info.metadata.get("field") if info is not None else None


def _accepted(
    spans: list[Span],
    answer: Future[stream_pb2.StreamAckResult] | Future[stream_pb2.StreamNackResult] | None,
    timeout: float,
) -> list[bool] | None:
    """Whether each of ``spans`` was accepted, from the ``answer`` to the request that sent
    them; None if it was not sent or not answered in ``timeout`` (the caller falls back)."""
    if answer is None:
        return None
    try:
        result = answer.result(timeout=timeout)
    except Exception:
        return None
    return accepted_spans(spans, result.rejected_ranges)


def _holds_records(batch: stream_pb2.StreamBatch) -> bool:
    return bool(batch.records or batch.batches or batch.shared)


class OwedCredit:
    """The credit a stream owes its sidecar: records that arrived since the last grant,
    granted back once they reach half the window. The sidecar still holds at least the
    other half meanwhile, so no reader waits for it, and a batch of a few records costs
    no credit message of its own (one request in two on the stream before, issue 34)."""

    def __init__(self, window: int) -> None:
        self.threshold = max(1, window // 2)
        self.owed = 0

    def arrived(self, records: int) -> int:
        """``records`` arrived: the credit to grant now (0: not yet)."""
        self.owed += records
        if self.owed < self.threshold:
            return 0
        due, self.owed = self.owed, 0
        return due

    def reset(self) -> None:
        """A new opening: its initial credit is the whole window again."""
        self.owed = 0


class SidecarStream:
    """One ``Stream`` call to one sidecar, on its own thread, re-opened while the sidecar is
    bound. Batches go to ``out``; ack results resolve the futures of :meth:`ack` in order.

    Each opening is a new *generation* (1, 2, ...): the shared-memory regions an opening
    delivered are released on that opening only (:meth:`ack`, :meth:`release`); a region
    id of an opening that ended is dropped, its ring ended with it."""

    def __init__(
        self,
        sidecar: Sidecar,
        opening: stream_pb2.StreamOpen,
        out: queue.SimpleQueue[tuple[SidecarStream, Item]],
        *,
        columns: bool = False,
        frame_socket: bool = True,
    ) -> None:
        """``opening`` is sent first on every (re-)opened stream: the client, its group,
        ``auto_ack`` and the initial credit (the window). With ``columns``, batches are
        :class:`ColumnBatch`\\ es and the opening's format is chosen at each opening
        (``ARROW_SHM`` over the local socket, else ``BATCHES``). With ``frame_socket``,
        an opening over the local socket asks for the sidecar's frame socket
        (:mod:`dsclient.frame_socket`)."""
        self.sidecar = sidecar
        self.address = sidecar.address
        self.opening = opening
        self.out = out
        self.columns = columns
        # The format of the running (or last) opening; DELIVERY_FORMAT_UNSPECIFIED before.
        self.format: stream_pb2.DeliveryFormat.ValueType = stream_pb2.DELIVERY_FORMAT_UNSPECIFIED
        self._shared_off = False  # the sidecar refused ARROW_SHM, or its batches were unreadable
        # Not asked for, refused by the sidecar, or it could not be used here.
        self._frames_off = not frame_socket
        self._lock = threading.Lock()
        # Held by whoever sends a request (credit, acks, nacks), around its queueing and its
        # write to the frame socket, so requests go in the order their futures were queued;
        # never held by the stream's thread, which reads the answers.
        self._send_lock = threading.Lock()
        self._requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] | None = None
        # The running opening's frame socket (StreamOpen.frame_socket), once connected.
        self._frames: FrameSocket | None = None
        # Requests made while the running opening waits for the frame socket it asked for:
        # sent there first once it is connected (the sidecar refuses them on the call),
        # dropped with the opening if it ends first (their futures fail with it).
        self._held: list[stream_pb2.StreamRequest] | None = None
        self._generation = 0
        self._owed = OwedCredit(opening.initial_credit.records)
        self._pending: deque[Future[stream_pb2.StreamAckResult]] = deque()
        self._pending_nacks: deque[Future[stream_pb2.StreamNackResult]] = deque()
        self._call: grpc.Call | None = None
        self._stopped = threading.Event()
        self.failed = False  # ended with an error handed to the application (out)
        self._thread = threading.Thread(target=self._run, name="ds-stream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def ended(self) -> bool:
        """Whether the stream's thread has ended (started, and no longer reading): its
        sidecar's channels were closed (a binding dropped it), it was stopped, or it
        handed the application an error (:attr:`failed`)."""
        return self._thread.ident is not None and not self._thread.is_alive()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            requests, call, frames = self._requests, self._call, self._frames
        if requests is not None:
            requests.put(None)
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]
        if frames is not None:
            frames.close()

    def _submit(
        self,
        make: Callable[[int], stream_pb2.StreamRequest | None],
        answers: deque[Future[stream_pb2.StreamAckResult]]
        | deque[Future[stream_pb2.StreamNackResult]]
        | None = None,
        future: Future[stream_pb2.StreamAckResult]
        | Future[stream_pb2.StreamNackResult]
        | None = None,
    ) -> bool:
        """Send the request ``make`` builds for the running opening's generation (None:
        nothing to send), its answer's ``future`` queued on ``answers`` first: on the
        frame socket when the opening has one, else on the call. False if no opening runs
        or nothing was sent. A frame that cannot be written (the sidecar went) is answered
        like the rest: the opening ends and fails the futures it holds."""
        with self._send_lock:
            with self._lock:
                if self._requests is None:
                    return False
                request = make(self._generation)
                if request is None:
                    return False
                if answers is not None:
                    answers.append(future)  # type: ignore[arg-type]
                frames = self._frames
                if frames is None:
                    if self._held is not None:
                        self._held.append(request)
                    else:
                        self._requests.put(request)
                    return True
            self._send_frames(frames, [request])
        return True

    def _send_frames(self, frames: FrameSocket, requests: list[stream_pb2.StreamRequest]) -> None:
        """Write ``requests`` on the frame socket, in order (holding the send lock). One that
        cannot be written (the sidecar went) closes it: the stream's thread sees the end,
        and the opening fails the futures it holds."""
        try:
            for request in requests:
                frames.send(request)
        except OSError as exc:
            log.info("sidecar %s: frame not sent: %s", self.address, exc)
            frames.close()

    def grant(self, records: int) -> None:
        """``records`` arrived: credit them back, once half the window is owed."""
        with self._lock:
            if self._requests is None:
                return
            due = self._owed.arrived(records)
        if due:
            credit = stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=due))
            self._submit(lambda _generation: credit)

    def ack(
        self,
        spans: list[Span],
        timeout: float,
        released: Mapping[int, Sequence[int]] | None = None,
        *,
        answer_now: bool = True,
    ) -> list[bool] | None:
        """Range acks sent on the stream: whether each was accepted, or None if the stream
        could not answer (not open, broken, slow) and the caller should use the Ack RPC.
        ``released`` (generation → region ids) go with them, those of the running
        generation only. ``answer_now`` False: the caller does not hold up a reader
        (``ack_nowait``), so the sidecar may answer with its next batch."""
        return _accepted(spans, self.ack_async(spans, released, answer_now=answer_now), timeout)

    def ack_async(
        self,
        spans: list[Span],
        released: Mapping[int, Sequence[int]] | None = None,
        *,
        answer_now: bool = True,
    ) -> Future[stream_pb2.StreamAckResult] | None:
        """:meth:`ack` without waiting: the future of its answer, resolved by the stream's
        thread when the answer comes (an exception if the opening ends first), or None if
        no opening runs."""
        future: Future[stream_pb2.StreamAckResult] = Future()
        ranges = [s.range_ack() for s in spans]

        def acks(generation: int) -> stream_pb2.StreamRequest:
            regions = regions_of(released or {}, generation)
            message = stream_pb2.StreamAcks(ranges=ranges, released=regions, answer_now=answer_now)
            return stream_pb2.StreamRequest(acks=message)

        return future if self._submit(acks, self._pending, future) else None

    def release(self, released: Mapping[int, Sequence[int]]) -> int:
        """Give shared-memory regions back (an ``acks`` message with only ``released``),
        without waiting for its answer: those of the running generation; how many were
        sent."""
        sent = 0

        def release(generation: int) -> stream_pb2.StreamRequest | None:
            nonlocal sent
            regions = regions_of(released, generation)
            sent = len(regions)
            # Nobody waits for its answer: it may ride a batch.
            return (
                stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(released=regions))
                if regions
                else None
            )

        # Its answer comes in order with the others.
        return sent if self._submit(release, self._pending, Future()) else 0

    def nack(self, spans: list[Span], delay: float, timeout: float) -> list[bool] | None:
        """Range nacks sent on the stream (records to deliver again after ``delay`` s):
        whether each was accepted, or None if the stream could not answer."""
        future: Future[stream_pb2.StreamNackResult] = Future()
        nacks = stream_pb2.StreamNacks(ranges=[s.range_ack() for s in spans])
        if delay:
            nacks.delay.FromNanoseconds(int(delay * 1e9))
        sent = self._submit(
            lambda _generation: stream_pb2.StreamRequest(nacks=nacks), self._pending_nacks, future
        )
        return _accepted(spans, future if sent else None, timeout)

    def _request_iterator(
        self,
        requests: queue.SimpleQueue[stream_pb2.StreamRequest | None],
        opening: stream_pb2.StreamOpen,
    ) -> Iterator[stream_pb2.StreamRequest]:
        yield stream_pb2.StreamRequest(open=opening)
        while (request := requests.get()) is not None:
            yield request

    def _open(
        self, requests: queue.SimpleQueue[stream_pb2.StreamRequest | None]
    ) -> tuple[grpc.CallIterator[Response], Segments | None, Path | None]:
        """Open the call: the opening's format; for ARROW_SHM, the segments' directory;
        with ``frame_socket`` (over the local socket), the directory of its socket."""
        opening = stream_pb2.StreamOpen()
        opening.CopyFrom(self.opening)
        target, call = self.sidecar.columns_call() if self.columns else self.sidecar.records_call()
        socket = path_of(target) if target != self.address else None
        local = socket.parent if socket is not None else None
        opening.frame_socket = local is not None and not self._frames_off
        segments = None
        if self.columns:
            shared = local is not None and not self._shared_off
            opening.format = (
                stream_pb2.DELIVERY_FORMAT_ARROW_SHM
                if shared
                else stream_pb2.DELIVERY_FORMAT_BATCHES
            )
            segments = Segments(local) if shared and local is not None else None
        self.format = opening.format
        responses = call(self._request_iterator(requests, opening))
        return (
            cast("grpc.CallIterator[Response]", responses),
            segments,
            local if opening.frame_socket else None,
        )

    def _responses(
        self, call: grpc.CallIterator[Response], frames_in: Path | None
    ) -> Iterator[Response]:
        """The opening's responses: the call's, until it names its frame socket (an
        opening that asked for one, ``frames_in`` its directory), then the socket's frames
        read as the call's would be, until the sidecar closes it; then the call's end (its
        status raised as the call's). A socket that cannot be used ends the opening: it is
        opened again without one."""
        holding = frames_in is not None  # requests wait for the frame socket asked for
        for response in call:
            if (
                frames_in is None
                or not isinstance(response, stream_pb2.StreamResponse)
                or response.WhichOneof("kind") != "frame_socket"
            ):
                if holding:  # a sidecar older than frame_socket: everything on the call
                    self._unhold()
                    holding = False
                yield response
                continue
            try:
                frames = FrameSocket(
                    frames_in, response.frame_socket.name, response.frame_socket.token
                )
            except FrameSocketError as exc:
                log.warning("sidecar %s: %s; re-opening without it", self.address, exc)
                self._frames_off = True
                call.cancel()  # type: ignore[no-untyped-call]
                return
            with self._send_lock:
                with self._lock:
                    self._frames = frames
                    held, self._held = self._held or [], None
                self._send_frames(frames, held)  # ahead of any request made from now on
            read = streamed_columns if self.columns else streamed
            try:
                for data in frames.frames():
                    yield read(data)
            finally:
                with self._send_lock, self._lock:
                    self._frames = None
                frames.close()
            for _ in call:  # the sidecar closed the socket: the call ends now, with its status
                pass
            return

    def _unhold(self) -> None:
        """The opening goes on without a frame socket: the requests held for it go on the
        call, in order, and the next ones too."""
        with self._send_lock, self._lock:
            held, self._held = self._held, None
            if held and self._requests is not None:
                for request in held:
                    self._requests.put(request)

    def _refused_shared(self, error: grpc.RpcError) -> bool:
        """Whether the sidecar refused the ARROW_SHM this opening asked for."""
        if self.format != stream_pb2.DELIVERY_FORMAT_ARROW_SHM:
            return False
        return _refused_field(error) in ("open.format", "format")

    def _answered(self, answers: Iterable[stream_pb2.StreamAckResult]) -> None:
        """Answers to this stream's acks, in the order they were sent."""
        for answer in answers:
            with self._lock:
                future = self._pending.popleft() if self._pending else None
            if future is not None:
                future.set_result(answer)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopped.is_set():
            requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()
            try:
                call, segments, frames_in = self._open(requests)
            except ValueError as exc:
                # The channel was closed: a binding dropped this sidecar (a binding naming
                # its address again makes a new one, and the client a new stream for it),
                # or the client closed.
                log.info("sidecar %s: stream ends, its channel was closed: %s", self.address, exc)
                return
            with self._lock:
                self._requests, self._call = requests, call
                self._held = [] if frames_in is not None else None
                self._owed.reset()  # each opening starts with the whole window
                self._generation += 1
                generation = self._generation
            try:
                for response in self._responses(call, frames_in):
                    if isinstance(response, Answered):
                        self._answered(response.answers)
                        response = response.item
                        if not response:  # answers only
                            continue
                    if isinstance(response, Batch):
                        self.out.put((self, response))
                        backoff = 0.1
                    elif isinstance(response, list):  # RecordBatches for columns
                        self.out.put((self, columns_of_fields(response)))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "batch":
                        if response.batch.ack_results:
                            self._answered(response.batch.ack_results)
                            if not _holds_records(response.batch):
                                continue
                        if self.columns:
                            try:
                                item: Item = columns_of(response.batch, segments, self, generation)
                            except SharedBatchError as exc:
                                # Not readable here (the segment is not in this container's
                                # view of the directory, say): the sidecar delivers it again
                                # on a stream re-opened with BATCHES.
                                log.warning(
                                    "sidecar %s: shared batch unreadable; re-opening with "
                                    "BATCHES: %s",
                                    self.address,
                                    exc,
                                )
                                self._shared_off = True
                                call.cancel()  # type: ignore[no-untyped-call]
                                break
                        else:
                            item = received(response.batch)
                        self.out.put((self, item))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "ack_result":
                        self._answered([response.ack_result])
                    elif response.WhichOneof("kind") == "nack_result":
                        with self._lock:
                            nacked = self._pending_nacks.popleft() if self._pending_nacks else None
                        if nacked is not None:
                            nacked.set_result(response.nack_result)
                error: grpc.RpcError | None = None
            except grpc.RpcError as err:
                error = err
            except ClientError as err:
                self.failed = True
                self.out.put((self, err))
                call.cancel()  # type: ignore[no-untyped-call]
                self._stopped.set()
                error = None
            except ValueError as exc:  # the channel was closed (unbound, or the client closed)
                log.info("sidecar %s: stream ends: %s", self.address, exc)
                error = None
                self._stopped.set()
            except Exception:
                # Anything else (a response the client cannot read, say) ends this opening,
                # not the stream: it re-opens after the backoff, and the sidecar delivers
                # again what was not acked.
                log.exception("sidecar %s: stream failed; re-opening", self.address)
                call.cancel()  # type: ignore[no-untyped-call]
                error = None
            finally:
                with self._lock:
                    self._requests, self._call, self._held = None, None, None
                    pending, self._pending = self._pending, deque()
                    pending_nacks, self._pending_nacks = self._pending_nacks, deque()
                requests.put(None)
                for future in pending:
                    future.set_exception(ConnectionError("stream ended"))
                for nack_future in pending_nacks:
                    nack_future.set_exception(ConnectionError("stream ended"))
            if self._stopped.is_set():
                return
            if error is not None and _refused_field(error) == "open.frame_socket":
                log.info(
                    "sidecar %s: no frame socket (%s); streaming on the call",
                    self.address,
                    error.details(),
                )
                self._frames_off = True
                continue
            if error is not None and self._refused_shared(error):
                log.info("sidecar %s does not serve ARROW_SHM; reading BATCHES", self.address)
                self._shared_off = True
                continue
            if error is not None and error.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                self.failed = True
                self.out.put(
                    (
                        self,
                        ClientError(
                            f"Stream from {self.address}: {error.code().name}: {error.details()}"
                        ),
                    )
                )
                return
            # The sidecar is going or the stream broke: re-open while it is still bound
            # (over TCP if its socket failed).
            if error is not None and error.code() is grpc.StatusCode.UNAVAILABLE:
                self.sidecar.fall_back()
            self._stopped.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 2.0)
