"""The published fault events: the latest ones for ``ListFaults`` and the live
``WatchFaults`` streams.

An event enters only once Kafka confirmed it (so nothing listed or watched is missing from
``ds.faults``). The latest events are seeded from the outbox's history table at start, so a
restarted notifier lists what it published before. Event-loop only: the relay thread hands
events over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable, Iterator

from dataservice.common.v1 import common_pb2

# Events a watcher may fall behind by; past it, it misses events rather than holding back
# the other watchers or growing without bound.
WATCH_BUFFER = 10_000


class FaultHistory:
    def __init__(
        self,
        events: Iterable[common_pb2.FaultEvent],
        *,
        size: int,
        watch_buffer: int = WATCH_BUFFER,
    ) -> None:
        """``events``: what was published before, oldest first; the last ``size`` are kept."""
        self._recent: deque[common_pb2.FaultEvent] = deque(events, maxlen=size)
        self._watchers: set[asyncio.Queue[common_pb2.FaultEvent]] = set()
        self._watch_buffer = watch_buffer

    def recent(self) -> list[common_pb2.FaultEvent]:
        """The latest published events, oldest first."""
        return list(self._recent)

    def add(self, events: Iterable[common_pb2.FaultEvent]) -> None:
        """Events Kafka confirmed, in the order they were published."""
        for event in events:
            self._recent.append(event)
            for queue in list(self._watchers):
                if not queue.full():
                    queue.put_nowait(event)

    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Queue[common_pb2.FaultEvent]]:
        """A queue of every event added while the block runs."""
        queue: asyncio.Queue[common_pb2.FaultEvent] = asyncio.Queue(maxsize=self._watch_buffer)
        self._watchers.add(queue)
        try:
            yield queue
        finally:
            self._watchers.discard(queue)
