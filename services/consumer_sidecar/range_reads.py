"""What ``ReadRange`` gave each client, per partition and lease epoch: explicit commits
(``CommitOffsets``) are bound to the client that read the records (issue 18, item 4).

An explicit commit moves the group past records. Before this, any caller of the group that
knew a partition's epoch (``Status`` shows it) could commit any offset of it and so skip
records it never read. Now a commit of ``offset`` under ``epoch`` is accepted only from a
client that ``ReadRange`` on this sidecar gave records up to at least ``offset`` (its
highest ``next_offset`` sent) under that same epoch. The refusals use the ack binding's
words (``acks.py``):

* the client was given nothing of the partition under the epoch, but another client was:
  ``REJECT_REASON_NOT_HOLDER`` (as an ack of a record in flight to another client);
* the offset is beyond what the client was given, or nothing was read under the epoch at
  all: ``REJECT_REASON_NOT_DELIVERED`` (as an ack of a record never delivered).

Per epoch: a new epoch (the lease moved, even back to this sidecar) starts with nothing
given, as a new lease's ack tracker does, so the holder of the new epoch reads before it
commits. Kept per partition for at most :data:`MAX_CLIENTS_PER_PARTITION` clients (the
least recently served goes first), so callers inventing client ids cannot grow it.

Pure: no I/O, no clock, one thread (the event loop) uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataservice.sidecar.v1 import stream_pb2
from services.runtime.topic_partition import TP

MAX_CLIENTS_PER_PARTITION = 64

Problem = tuple[stream_pb2.RejectReason.ValueType, str]


@dataclass
class _Given:
    epoch: int
    ends: dict[str, int] = field(default_factory=dict)  # client -> highest next_offset


class RangeReads:
    """Per partition, under its latest epoch read: how far ``ReadRange`` got each client."""

    def __init__(self, max_clients: int = MAX_CLIENTS_PER_PARTITION) -> None:
        self._max_clients = max_clients
        self._given: dict[TP, _Given] = {}

    def given(self, tp: TP, epoch: int, client: str, next_offset: int) -> None:
        """``client`` was sent the records of ``tp`` below ``next_offset`` under ``epoch``
        (a chunk's ``next_offset``). An older epoch than the one recorded is ignored."""
        entry = self._given.get(tp)
        if entry is None or epoch > entry.epoch:
            entry = self._given[tp] = _Given(epoch)
        elif epoch < entry.epoch:
            return
        end = max(entry.ends.pop(client, next_offset), next_offset)
        entry.ends[client] = end  # re-inserted: the most recently served is last
        if len(entry.ends) > self._max_clients:
            del entry.ends[next(iter(entry.ends))]

    def reach(self, tp: TP, epoch: int, client: str) -> int | None:
        """How far ``client`` was given ``tp`` under ``epoch``, or None (nothing)."""
        entry = self._given.get(tp)
        if entry is None or entry.epoch != epoch:
            return None
        return entry.ends.get(client)

    def commit_problem(self, tp: TP, epoch: int, client: str, offset: int) -> Problem | None:
        """Why ``client`` may not commit ``offset`` of ``tp`` under ``epoch``, or None."""
        name = f"{tp.topic}[{tp.partition}]"
        end = self.reach(tp, epoch, client)
        if end is not None and offset <= end:
            return None
        if end is not None:
            return (
                stream_pb2.REJECT_REASON_NOT_DELIVERED,
                f"offset {offset} is beyond {end}, the end of what ReadRange gave client "
                f"{client!r} of {name} under epoch {epoch}; read the records before "
                "committing past them",
            )
        entry = self._given.get(tp)
        if entry is not None and entry.epoch == epoch and entry.ends:
            return (
                stream_pb2.REJECT_REASON_NOT_HOLDER,
                f"ReadRange gave {name} under epoch {epoch} to another client of the group, "
                f"not to {client!r}; only a client that read the records may commit past them",
            )
        return (
            stream_pb2.REJECT_REASON_NOT_DELIVERED,
            f"ReadRange gave no client {name} under epoch {epoch}; read the records before "
            "committing past them",
        )
