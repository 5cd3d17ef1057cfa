"""A Stream's flow control: the credit its client granted, the events it waits on, and the
bound on the answers waiting for its client (``stream_rpc.py`` serves the Stream over it)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import Slice
from services.consumer_sidecar.wakeup import bring_forward

if TYPE_CHECKING:
    from services.consumer_sidecar.shm_segment import Segment

# A Stream's answers waiting for its client (queued, or acks being committed): past this
# many the sidecar reads none of the client's messages until it has read some (issue 37,
# finding 11), so a client that sends without reading grows nothing on the sidecar.
MAX_STREAM_RESULTS = 256
# StreamOpen.answers_with_batches: an ack's answer that was not asked for now waits at most
# this long for the stream's next batch to carry it, then goes alone. At 100 records/s a
# batch leaves every 10 ms or so, so nearly every answer rides on one (issue 34: the
# third gRPC message per batch); a reader blocked on its answer asks for it now.
ANSWER_HOLD_SECONDS = 0.1


@dataclass
class Credit:
    """A Stream's flow-control credit (StreamCredit semantics). Byte credit is unlimited
    until the client grants bytes for the first time; from then on it is counted. A batch
    may overdraw the byte credit (it holds at least one record); nothing more is sent until
    the client grants enough to bring it above zero again."""

    records: int = 0
    bytes: int | None = None  # None = no byte limit

    def add(self, records: int, nbytes: int) -> None:
        self.records += records
        if nbytes:
            self.bytes = nbytes if self.bytes is None else self.bytes + nbytes

    def available(self) -> bool:
        return self.records > 0 and (self.bytes is None or self.bytes > 0)

    def limits(self, max_records: int, max_bytes: int) -> tuple[int, int]:
        byte_limit = max_bytes if self.bytes is None else min(max_bytes, self.bytes)
        return min(self.records, max_records), byte_limit

    def spend(self, records: int, nbytes: int) -> None:
        self.records -= records
        if self.bytes is not None:
            self.bytes -= nbytes


class DataEvent(asyncio.Event):
    """A stream's data event: setting it sets the stream's ``wake`` too while ``wanted``,
    so a Stream waits for either on one event (``StreamRpc._wait``) instead of a task for
    each and ``asyncio.wait`` around them, at every batch (issue 34: the per-batch cost)."""

    def __init__(self, wake: asyncio.Event) -> None:
        super().__init__()
        self.wake = wake
        self.wanted = False

    def set(self) -> None:
        super().set()
        if self.wanted:
            self.wake.set()


@dataclass
class StreamState:
    credit: Credit
    auto_ack: bool
    columns: bool  # DELIVERY_FORMAT_BATCHES
    # StreamOpen.linger (seconds): the next batch goes out no sooner than this after the
    # last one, unless a whole batch is buffered (batching in time at low rates; issue 34).
    linger: float = 0.0
    next_send_at: float = 0.0  # the event loop's clock: when the linger since the last ends
    # DELIVERY_FORMAT_ARROW_SHM: the stream's segment, and what was taken for the stream and
    # waits for room in it (delivered to the stream's holder already).
    segment: Segment | None = None
    pending: list[Slice] = field(default_factory=list)
    results: deque[stream_pb2.StreamResponse] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None  # DsError, or a bug's exception (INTERNAL)
    ended: bool = False  # the client half-closed or went away
    client_id: str = ""  # for the client-access metrics
    # The answer to the latest acks (their commit): answers go out in the order of the acks.
    answering: asyncio.Task[None] | None = None
    # Acks read whose answer is still being committed (not in ``results`` yet).
    unanswered: int = 0
    # Set when the client took answers: the request reader, stopped at MAX_STREAM_RESULTS
    # answers waiting, reads on.
    room: asyncio.Event = field(default_factory=asyncio.Event)
    # StreamOpen.answers_with_batches: ack answers held for the next batch to carry
    # (StreamBatch.ack_results), in order, until ``held_until`` (the event loop's clock).
    hold_answers: bool = False
    held: list[stream_pb2.StreamAckResult] = field(default_factory=list)
    held_until: float = 0.0
    # The loop's wait in progress (``StreamRpc._wait``): its timeout, which a first held
    # answer cuts to the hold's deadline, and whether it waits for records (else for the
    # client).
    waiting: asyncio.Timeout | None = None
    waiting_for_data: bool = False

    def backlog(self) -> int:
        """The answers waiting for the client: queued, held, or acks being committed."""
        return len(self.results) + len(self.held) + self.unanswered

    def answer(self, result: stream_pb2.StreamAckResult, now_ok: bool, now: float) -> bool:
        """Queue the answer to an ``acks`` message, after those before it: held for the
        next batch when the stream allows it and the client did not ask for it now
        (``now_ok`` False), else sent on its own (the held ones first, keeping the order).
        True when the stream's loop must look again: something to send, or a first held
        answer while the loop waits for the client (:meth:`on_first_held`)."""
        if self.hold_answers and not now_ok:
            first = not self.held
            self.held.append(result)
            if first:
                self.held_until = now + ANSWER_HOLD_SECONDS
                return self.on_first_held()
            return False
        self.flush_held()
        self.results.append(stream_pb2.StreamResponse(ack_result=result))
        return True

    def looks_again_for(self, kind: str) -> bool:
        """Whether the loop must look again for a client message of ``kind`` (after it was
        applied). Not for acks: they change nothing it can send (their answer comes once
        committed, :meth:`answer`; a release of segment regions wakes it where it is
        read). Not for credit while it waits for records: with credit left, nothing it can
        send changes either. A look for nothing was a take() and a new wait, for each
        message at every batch (issue 34)."""
        if kind == "acks":
            return False
        return not (kind == "credit" and self.waiting is not None and self.waiting_for_data)

    def on_first_held(self) -> bool:
        """An answer is held where none was: whether the loop must look again. Waiting for
        records, it need not (issue 34: a look per answer was a take() and a new wait, at
        every batch): its wait is cut to the hold's deadline, and records that come first
        carry the answer. Waiting for the client (credit, a release), it must: the answers
        go now, on their own (``StreamRpc._wait``). Not waiting, it sees them at its next
        wait (``wait_limit``)."""
        if self.waiting is None or self.waiting.expired():
            return False  # about to look again anyway
        if not self.waiting_for_data:
            return True
        bring_forward(self.waiting, self.held_until)
        return False

    def flush_held(self) -> None:
        """The held answers go on their own, as ``ack_result`` messages, in order."""
        for result in self.held:
            self.results.append(stream_pb2.StreamResponse(ack_result=result))
        self.held.clear()

    def take_held(self) -> list[stream_pb2.StreamAckResult]:
        """The held answers, for the batch about to go out."""
        held, self.held = self.held, []
        return held

    def hold_due(self, now: float) -> bool:
        """Whether held answers must go now: their deadline passed, or the stream ends."""
        return bool(self.held) and (now >= self.held_until or self.ended or self.error is not None)

    def wait_limit(self, timeout: float, now: float) -> float:
        """``timeout`` cut to the held answers' deadline."""
        return min(timeout, max(0.0, self.held_until - now)) if self.held else timeout

    def drained(self) -> None:
        """The client took answers (the generator resumed after yielding them)."""
        self.room.set()

    async def wait_for_room(self) -> None:
        """Return once fewer than MAX_STREAM_RESULTS answers wait for the client."""
        while True:
            self.room.clear()
            if self.backlog() < MAX_STREAM_RESULTS:
                return
            await self.room.wait()

    # Set when records can be taken (DataSignal.add_waiter): this stream's own, which sets
    # ``wake`` too while the stream waits for records (``StreamRpc._wait``).
    data: DataEvent = field(init=False)

    def __post_init__(self) -> None:
        self.data = DataEvent(self.wake)
