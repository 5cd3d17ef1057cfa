"""What ``ReadRange`` gave each client, per partition and lease epoch: explicit commits
(``CommitOffsets``) are bound to the client that read the records (issue 18, item 4), and
to every record they move the group past (issue 37, finding 9).

An explicit commit moves the group past records. Before issue 18, any caller of the group
that knew a partition's epoch (``Status`` shows it) could commit any offset of it and so
skip records it never read; until issue 37 a client that read only the last record could
commit past every record before it. Now a commit of ``offset`` under ``epoch`` is accepted
only from a client that ``ReadRange`` on this sidecar gave *every* record of
``[committed, offset)`` under that same epoch (``committed``: the partition's committed
offset here), and never below ``committed``. The refusals use the ack binding's words
(``acks.py``):

* the client was given nothing of the partition under the epoch, but another client was:
  ``REJECT_REASON_NOT_HOLDER`` (as an ack of a record in flight to another client);
* a record of ``[committed, offset)`` was not given to the client, or nothing was read
  under the epoch at all: ``REJECT_REASON_NOT_DELIVERED`` (as an ack of a record never
  delivered), naming the first such offset;
* ``offset`` is below ``committed``: ``REJECT_REASON_OFFSET_OUT_OF_RANGE``. A commit never
  goes backward: rewinding a group is an admin's ``ResetOffsets``.

Per epoch: a new epoch (the lease moved, even back to this sidecar) starts with nothing
given, as a new lease's ack tracker does, so the holder of the new epoch reads before it
commits. Kept per partition for at most :data:`MAX_CLIENTS_PER_PARTITION` clients (the
least recently served goes first) and per client at most :data:`MAX_SPANS_PER_CLIENT`
disjoint spans (the lowest goes first: forgetting only refuses more), so callers inventing
client ids or reading scattered ranges cannot grow it.

Pure: no I/O, no clock, one thread (the event loop) uses it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from dataservice.sidecar.v1 import stream_pb2
from services.runtime.topic_partition import TP

MAX_CLIENTS_PER_PARTITION = 64
MAX_SPANS_PER_CLIENT = 32

Problem = tuple[stream_pb2.RejectReason.ValueType, str]
Span = tuple[int, int]  # [lo, hi)


def add_span(spans: list[Span], lo: int, hi: int, limit: int = MAX_SPANS_PER_CLIENT) -> None:
    """Merge ``[lo, hi)`` into the sorted, disjoint, non-touching ``spans`` (in place);
    past ``limit`` spans the lowest are forgotten."""
    if hi <= lo:
        return
    i = bisect.bisect_left(spans, (lo, lo))
    if i > 0 and spans[i - 1][1] >= lo:
        i -= 1
    j = i
    while j < len(spans) and spans[j][0] <= hi:
        lo, hi = min(lo, spans[j][0]), max(hi, spans[j][1])
        j += 1
    spans[i:j] = [(lo, hi)]
    del spans[: max(0, len(spans) - limit)]


def first_gap(spans: list[Span], lo: int, hi: int) -> int | None:
    """The first offset of ``[lo, hi)`` that ``spans`` do not cover, or None."""
    for start, end in spans:
        if lo >= hi:
            return None
        if start > lo:
            return lo
        lo = max(lo, end)
    return lo if lo < hi else None


@dataclass
class _Given:
    epoch: int
    spans: dict[str, list[Span]] = field(default_factory=dict)  # client -> what it was given


class RangeReads:
    """Per partition, under its latest epoch read: what ``ReadRange`` gave each client."""

    def __init__(
        self,
        max_clients: int = MAX_CLIENTS_PER_PARTITION,
        max_spans: int = MAX_SPANS_PER_CLIENT,
    ) -> None:
        self._max_clients = max_clients
        self._max_spans = max_spans
        self._given: dict[TP, _Given] = {}

    def given(self, tp: TP, epoch: int, client: str, start: int, next_offset: int) -> None:
        """``client`` was sent the records of ``tp`` in ``[start, next_offset)`` under
        ``epoch`` (one chunk: from the range's start or the previous chunk's
        ``next_offset`` to its own). An older epoch than the one recorded is ignored."""
        entry = self._given.get(tp)
        if entry is None or epoch > entry.epoch:
            entry = self._given[tp] = _Given(epoch)
        elif epoch < entry.epoch:
            return
        spans = entry.spans.pop(client, [])
        add_span(spans, start, next_offset, self._max_spans)
        entry.spans[client] = spans  # re-inserted: the most recently served is last
        if len(entry.spans) > self._max_clients:
            del entry.spans[next(iter(entry.spans))]

    def reach(self, tp: TP, epoch: int, client: str) -> int | None:
        """How far ``client`` was given ``tp`` under ``epoch`` (the end of its highest
        span), or None (nothing)."""
        entry = self._given.get(tp)
        if entry is None or entry.epoch != epoch:
            return None
        spans = entry.spans.get(client)
        return spans[-1][1] if spans else None

    def commit_problem(
        self, tp: TP, epoch: int, client: str, offset: int, committed: int
    ) -> Problem | None:
        """Why ``client`` may not commit ``offset`` of ``tp`` under ``epoch`` while the
        partition's committed offset is ``committed``, or None (module docstring)."""
        name = f"{tp.topic}[{tp.partition}]"
        entry = self._given.get(tp)
        spans = entry.spans.get(client) if entry is not None and entry.epoch == epoch else None
        if not spans:
            if entry is not None and entry.epoch == epoch and entry.spans:
                return (
                    stream_pb2.REJECT_REASON_NOT_HOLDER,
                    f"ReadRange gave {name} under epoch {epoch} to another client of the "
                    f"group, not to {client!r}; only a client that read the records may "
                    "commit past them",
                )
            return (
                stream_pb2.REJECT_REASON_NOT_DELIVERED,
                f"ReadRange gave no client {name} under epoch {epoch}; read the records "
                "before committing past them",
            )
        if offset < committed:
            return (
                stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
                f"offset {offset} is below {committed}, the committed offset of {name}: a "
                "commit never goes backward (rewinding a group is an admin's ResetOffsets)",
            )
        gap = first_gap(spans, committed, offset)
        if gap is not None:
            return (
                stream_pb2.REJECT_REASON_NOT_DELIVERED,
                f"ReadRange did not give client {client!r} the records of {name} from {gap} "
                f"under epoch {epoch} (committed: {committed}); read every record before "
                f"committing past it (offset {offset})",
            )
        return None
