"""``ack_nowait``'s thread: acks sent in the order given, those that queue up coalesced, and
those a fetch can carry left to it."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from dataservice.sidecar.v1 import stream_pb2
from dsclient.batch import Span, accepted_spans, counted
from dsclient.columns import Release

# Range acks in one coalesced ack_nowait send at most (the sidecar takes 100,000 a message).
MAX_COALESCED_SPANS = 10_000

# How long a queued ack waits for a fetch() to carry it (FetchRequest.ack_ranges) before the
# thread sends it with Ack itself, while the client reads with fetch(): a fetch loop's next
# fetch leaves well within it, and an application that stopped fetching pays this much.
CARRY_WAIT_SECONDS = 0.02
# The largest ack_nowait call a fetch carries, in records: a small batch's ack costs a call
# as dear as its records (low rates), a big one's is amortized, and at saturation a big
# batch's ack goes at once with Ack, as before, rather than being paced by the fetches.
CARRY_MAX_RECORDS = 1000
# How long carried acks wait for their answer, which comes with a later response of their
# sidecar (FetchResponse.acks), before the thread sends them again with Ack (acks are
# idempotent): an application that stopped fetching there still hears of them.
CARRIED_ANSWER_SECONDS = 2.0

# Carried acks waiting for their answer: by (sidecar address, ack_seq).
CarriedKey = tuple[str, int]


@dataclass
class Pending:
    """One ack_nowait call: its spans, the shared-memory regions it releases, its future,
    and when it was queued (``-inf``: send at once)."""

    spans: list[Span]
    releases: Sequence[Release]
    future: Future[int]
    queued_at: float

    @property
    def carriable(self) -> bool:
        """Whether a fetch may carry it: no shared-memory regions (a stream's), and a
        small batch (:data:`CARRY_MAX_RECORDS`)."""
        return not self.releases and sum(span.count for span in self.spans) <= CARRY_MAX_RECORDS


class Acker:
    """``ack_nowait``'s thread: sends the acks queued since its last send as one ack (one
    commit on each sidecar, however many batches queued up meanwhile), in the order of
    the calls, and resolves each call's future with its own records' count.

    Without coalescing, a client that acks faster than a commit takes queued one commit
    per batch, and its acks fell further behind its reads the longer it ran.

    While ``carry_wait`` is above zero (the client reads with ``fetch()``), a queued ack
    waits that long for a fetch to :meth:`claim` it and carry it to its sidecar in the
    Fetch request; the thread sends what nobody claimed in time. A fetch whose sidecar
    applied them registers them (:meth:`carried`) until their answer comes with a later
    response (:meth:`answered`); one that failed hands them back (:meth:`give_back`), and
    so does the thread with those whose answer did not come in
    :data:`CARRIED_ANSWER_SECONDS`, or are still awaited at :meth:`close`."""

    def __init__(
        self,
        send: Callable[[list[Span], Sequence[Release]], list[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``send(spans, releases)``: the range acks and the shared-memory regions to give
        back with them (``stream_columns``); whether each span was accepted."""
        self._send = send
        self._clock = clock
        self._queue: deque[Pending] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._done = False  # the thread ended: nothing queued is sent any more
        self._in_flight: dict[CarriedKey, tuple[list[Pending], float]] = {}
        self.carry_wait = 0.0
        self._sending = False  # the thread is sending what it took off the queue
        self._thread = threading.Thread(target=self._run, name="ds-ack", daemon=True)
        self._thread.start()

    def submit(self, spans: list[Span], releases: Sequence[Release] = ()) -> Future[int]:
        future: Future[int] = Future()
        with self._changed:
            self._queue.append(Pending(spans, releases, future, self._clock()))
            self._changed.notify()
        return future

    @property
    def idle(self) -> bool:
        """Whether no ack is queued, being sent or carried awaiting its answer: an ack sent
        now by another way does not overtake one of this thread's."""
        with self._changed:
            return not self._queue and not self._in_flight and not self._sending

    def close(self) -> None:
        """Returns once every ack submitted before it has its answer."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()

    # ---- carried by a fetch -------------------------------------------------------------

    def claim(self, carries: Callable[[list[Span]], bool]) -> list[Pending]:
        """The acks at the head of the queue that ``carries`` takes (a fetch: each of the
        call's spans goes to the sidecar it calls), in order, off the queue: the caller
        answers them (:meth:`resolve`) or gives them back (:meth:`give_back`). Acks that
        are not :attr:`Pending.carriable` (a stream's, a big batch's) are never claimed."""
        claimed: list[Pending] = []
        count = 0
        with self._changed:
            while self._queue:
                head = self._queue[0]
                if not head.carriable or count + len(head.spans) > MAX_COALESCED_SPANS:
                    break
                if not carries(head.spans):
                    break
                claimed.append(self._queue.popleft())
                count += len(head.spans)
        return claimed

    @staticmethod
    def resolve(claimed: Sequence[Pending], accepted: Sequence[bool]) -> None:
        """Each claimed call's future gets its own records' count (``accepted``: whether
        each of their spans, in order, was accepted)."""
        start = 0
        for item in claimed:
            end = start + len(item.spans)
            item.future.set_result(counted(item.spans, accepted[start:end]))
            start = end

    def carried(self, key: CarriedKey, claimed: list[Pending]) -> None:
        """``claimed`` were applied by the sidecar of ``key`` (its response named their
        ack_seq): their answer comes with one of its later responses."""
        with self._changed:
            done = self._done
            if not done:
                self._in_flight[key] = (claimed, self._clock())
                self._changed.notify()  # the thread watches how long it takes
        if done:
            _not_accepted(claimed)

    def awaiting(self, address: str) -> bool:
        """Whether acks carried to the sidecar at ``address`` still wait for their answer:
        a fetch then carries none, and the acks that queue up meanwhile go together in a
        later one (one commit for them, as the thread's own sends coalesce)."""
        with self._changed:
            return any(key[0] == address for key in self._in_flight)

    def answered(self, key: CarriedKey, result: stream_pb2.StreamAckResult) -> None:
        """The answer to carried acks: each call's future gets its own records' count. An
        answer that comes after they were sent again with Ack is left alone."""
        with self._changed:
            entry = self._in_flight.pop(key, None)
        if entry is not None:
            claimed = entry[0]
            spans = [span for item in claimed for span in item.spans]
            self.resolve(claimed, accepted_spans(spans, result.rejected_ranges))

    def give_back(self, claimed: Sequence[Pending]) -> None:
        """Claimed acks no answer came for (the fetch failed, or its sidecar does not read
        carried acks): the thread sends them at once, ahead of the rest."""
        if not claimed:
            return
        with self._changed:
            done = self._done
            if not done:
                self._to_front(claimed)
                self._changed.notify()
        if done:  # closed while a fetch carried them: not known to be accepted
            _not_accepted(claimed)

    # ---- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = self._clock()
                    self._unanswered(now)
                    wait: float | None = None
                    if self._queue:
                        if self._closing:
                            break  # send what was queued before close(), then stop
                        head = self._queue[0]
                        wait = head.queued_at + self.carry_wait - now if head.carriable else 0
                        if wait <= 0:
                            break
                    elif self._closing:
                        self._done = True
                        return
                    if self._in_flight:
                        oldest = min(at for _, at in self._in_flight.values())
                        due = oldest + CARRIED_ANSWER_SECONDS - now
                        wait = due if wait is None else min(wait, due)
                    self._changed.wait(wait)
                items = [self._queue.popleft()]
                queued = len(items[0].spans)
                while self._queue and queued + len(self._queue[0].spans) <= MAX_COALESCED_SPANS:
                    items.append(self._queue.popleft())
                    queued += len(items[-1].spans)
                self._sending = True
            try:
                self._answer(items)
            finally:
                with self._changed:
                    self._sending = False

    def _unanswered(self, now: float) -> None:
        """Carried acks whose answer did not come in time (or that are still awaited at
        close) go to the head of the queue, to be sent with Ack at once."""
        keys = [
            key
            for key, (_, at) in self._in_flight.items()
            if self._closing or now - at >= CARRIED_ANSWER_SECONDS
        ]
        late = sorted((self._in_flight.pop(key) for key in keys), key=lambda entry: entry[1])
        for claimed, _ in reversed(late):
            self._to_front(claimed)

    def _to_front(self, claimed: Sequence[Pending]) -> None:
        """``claimed`` go to the head of the queue in their order, to be sent at once
        (called holding the lock)."""
        for item in reversed(claimed):
            item.queued_at = float("-inf")
            self._queue.appendleft(item)

    def _answer(self, items: list[Pending]) -> None:
        spans = [span for item in items for span in item.spans]
        releases = [release for item in items for release in item.releases]
        try:
            accepted = self._send(spans, releases)
        except BaseException as exc:  # every caller waiting gets the failure
            for item in items:
                item.future.set_exception(exc)
            return
        self.resolve(items, accepted)


def _not_accepted(claimed: Sequence[Pending]) -> None:
    """Carried acks the closed thread can no longer send: not known to be accepted."""
    Acker.resolve(claimed, [False] * sum(len(item.spans) for item in claimed))
