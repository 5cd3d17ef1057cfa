"""The answers to acks that clients carried in Fetch requests (``FetchRequest.ack_ranges``),
kept per client until a response to it takes them (``FetchResponse.acks``).

A Fetch does not wait for the commit of the acks it carries: it answers as soon as it has
records, with the answers whose commit has been made by then; the rest go with the next
response to the same client. An answer nobody takes (the client stopped fetching here, and
sent those acks again with Ack) is dropped after :data:`ANSWER_KEEP_SECONDS`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dataservice.sidecar.v1 import stream_pb2

# How long an answer waits for a response to its client (the client gives up on it much
# sooner and sends the acks with Ack: dsclient.acker.CARRIED_ANSWER_SECONDS).
ANSWER_KEEP_SECONDS = 60.0
# Answers kept per client at most; the oldest go first (its client sent them by Ack).
MAX_ANSWERS_PER_CLIENT = 1024


@dataclass(frozen=True)
class _Carried:
    seq: int
    answer: asyncio.Future[stream_pb2.StreamAckResult]
    at: float


class AckOutbox:
    """Per client, the carried acks whose answer it has not been sent yet, in the order
    they were applied."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_client: dict[str, deque[_Carried]] = {}
        self._next_sweep = 0.0

    def add(
        self, client: str, seq: int, answer: asyncio.Future[stream_pb2.StreamAckResult]
    ) -> None:
        now = self._clock()
        carried = self._by_client.setdefault(client, deque())
        carried.append(_Carried(seq, answer, now))
        while len(carried) > MAX_ANSWERS_PER_CLIENT:
            carried.popleft()
        if now >= self._next_sweep:
            self._sweep(now)

    def take(self, client: str) -> list[stream_pb2.FetchAckAnswer]:
        """The answers of ``client``'s carried acks whose commit has been made (or refused),
        each once; those still committing stay for a later response."""
        carried = self._by_client.get(client)
        if not carried:
            return []
        ready = [c for c in carried if c.answer.done()]
        if not ready:
            return []
        pending = deque(c for c in carried if not c.answer.done())
        if pending:
            self._by_client[client] = pending
        else:
            del self._by_client[client]
        return [
            stream_pb2.FetchAckAnswer(seq=c.seq, result=c.answer.result())
            for c in ready
            if not c.answer.cancelled() and c.answer.exception() is None
        ]

    def __len__(self) -> int:
        return sum(map(len, self._by_client.values()))

    def _sweep(self, now: float) -> None:
        """Drop answers older than the keep time (their clients stopped asking here)."""
        self._next_sweep = now + ANSWER_KEEP_SECONDS / 4
        cutoff = now - ANSWER_KEEP_SECONDS
        for client in list(self._by_client):
            kept = deque(c for c in self._by_client[client] if c.at >= cutoff)
            if kept:
                self._by_client[client] = kept
            else:
                del self._by_client[client]
