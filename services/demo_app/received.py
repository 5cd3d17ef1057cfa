"""The log of received records that ``GET /received`` serves (pure, thread-safe)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from dsclient import DsRecord


class ReceivedLog:
    """Every received record as ``[key, topic, partition, offset, lease_epoch, received_ms,
    acked]`` (``received_ms``: when its batch arrived; ``acked``: the sidecar accepted the
    ack of its whole batch), numbered from 0 in the order logged (once the ack returned),
    the oldest dropped past ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self._entries: deque[list[Any]] = deque(maxlen=capacity)
        self._total = 0
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return self._total

    def add(
        self, records: Iterable[DsRecord], *, acked: bool, received_ms: int | None = None
    ) -> None:
        now_ms = int(time.time() * 1000) if received_ms is None else received_ms
        rows = [
            [
                r.key.decode("utf-8", "replace") if r.key is not None else None,
                r.topic,
                r.partition,
                r.offset,
                r.lease_epoch,
                now_ms,
                acked,
            ]
            for r in records
        ]
        with self._lock:
            self._entries.extend(rows)
            self._total += len(rows)

    def page(self, since: int, limit: int) -> Mapping[str, Any]:
        """Entries numbered ``since`` onwards (at most ``limit``) and the number to ask next."""
        with self._lock:
            first = self._total - len(self._entries)
            start = max(since, first)
            rows = [self._entries[i - first] for i in range(start, min(self._total, start + limit))]
            return {
                "first": start,
                "next": start + len(rows),
                "total": self._total,
                "records": rows,
            }
