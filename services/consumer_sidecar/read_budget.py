"""How many ``ReadRange`` streams a sidecar runs at once, and the memory they may hold
(issue 18, item 9).

Each ReadRange stream reads on its own librdkafka consumer (``reader.py``), which prefetches
on its own: before, any caller could open any number of them, each with librdkafka's default
64 MiB queue, beside the leased buffer the operator sized with ``buffer_max_bytes``. Now a
stream costs what it may hold: its consumer's prefetch (``read_range_prefetch_bytes``, which
sets that consumer's ``queued.max.messages.kbytes`` and ``fetch.max.bytes``) plus the chunk
it builds (the request's ``max_bytes``). It reserves that from the sidecar's buffer cap when
it opens and gives it back when it ends, however it ends (done, failed, cancelled). What is
reserved comes off the leased buffer's share (``PartitionTable.reserved_bytes``), so the
leased buffer, its prefetch and every open stream together stay within ``buffer_max_bytes``.

Two limits, one refusal (``RESOURCE_EXHAUSTED`` / ``TOO_MANY_RANGE_READS``, metadata
``limit`` = ``streams`` or ``bytes``): at most ``read_range_max_streams`` streams at once, and
together at most ``read_range_buffer_share`` of the cap (the leased delivery keeps the rest).

Pure: counts only; the event loop is its one thread.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """Why a stream may not open now: ``limit`` is ``streams`` or ``bytes``."""

    limit: str
    message: str


class ReadBudget:
    def __init__(self, max_streams: int, max_bytes: int) -> None:
        self.max_streams = max_streams
        self.max_bytes = max_bytes  # what open streams may reserve together
        self.streams = 0
        self.reserved = 0

    def reserve(self, nbytes: int) -> Refusal | None:
        """Open a stream that may hold ``nbytes``; why not, or None (then it is counted
        until :meth:`release`)."""
        if self.streams >= self.max_streams:
            return Refusal(
                "streams",
                f"this sidecar runs {self.streams} ReadRange streams, its limit "
                f"(read_range_max_streams); retry when one has ended",
            )
        if self.reserved + nbytes > self.max_bytes:
            return Refusal(
                "bytes",
                f"a ReadRange stream here may hold {nbytes} bytes (prefetch and chunk) and "
                f"{self.reserved} of the {self.max_bytes} bytes ReadRange may use "
                f"(read_range_buffer_share of buffer_max_bytes) are taken; retry later or "
                f"ask for smaller chunks (max_bytes)",
            )
        self.streams += 1
        self.reserved += nbytes
        return None

    def release(self, nbytes: int) -> None:
        """A stream that reserved ``nbytes`` ended."""
        self.streams -= 1
        self.reserved -= nbytes
