"""What :meth:`~services.client.DsClient.stream_columns` hands the application: delivered
records as Arrow columns, and what acking them releases.

A :class:`ColumnBatch` holds one ``pa.RecordBatch`` per partition run, in the columns of
``ReadRange``'s ``ARROW_IPC`` chunks (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``timestamp``, ``headers``), the run's :class:`~services.client.batch.Span`
(so an ack is one ``RangeAck`` per run, as for a :class:`~services.client.batch.Batch`),
and the shared-memory regions its columns lie in (:class:`Release`), given back to the
sidecar with the batch's ack, nack, or (``auto_ack``) when the next batch is asked for.

A region id means something only on the stream that gave it, and only while that stream
runs: a stream that ended took its ring of regions with it, and the one re-opened in its
place numbers its regions afresh. So a release names the stream object and its
generation (how many times it was opened), and :func:`regions_of` keeps only the ids of
the generation still running.

Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

from services.client.batch import Span

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Release:
    """Shared-memory regions one stream generation delivered, to give back to it.

    Attributes:
        stream: The stream object that delivered them (a ``SidecarStream``).
        generation: Which opening of that stream (1 for the first, one more at each
            re-open).
        regions: The region ids (``SharedBatch.region``).
    """

    stream: Hashable
    generation: int
    regions: tuple[int, ...]


class ColumnBatch:
    """The records of what the ``Stream`` RPC delivered, as Arrow columns.

    **The columns are valid until the batch is acked** (:meth:`DsClient.ack`,
    :meth:`DsClient.ack_nowait`, :meth:`DsClient.nack`, or with ``auto_ack`` until the
    next batch is asked for): over the sidecar's local socket they are read in place from
    shared memory, which the sidecar writes over once they are released. Copy what must
    outlive the ack into memory of your own first: :meth:`copy` (the columns), or
    ``batch.table.to_pylist()`` (Python objects). Not ``combine_chunks()``,
    ``concat_tables`` or a slice: pyarrow returns a single chunk as it is, still in the
    shared memory. Over TCP the columns point into the received message, but treat them
    the same way: which transport a stream uses can change under the application.

    Attributes:
        record_batches: One ``pa.RecordBatch`` per partition run, rows in offset order, in
            the schema of ``ReadRange``'s ``ARROW_IPC`` chunks (``services.records.
            arrow_batches.SCHEMA``).
        spans: The offset range of each run, in the same order (one ``RangeAck`` each when
            the batch is acked).
        delivery_counts: How many times each run's records have been delivered, this
            delivery included (1 the first time; more after a redelivery: an ack deadline
            passed, a nack, a stream that ended).
        releases: The shared-memory regions the columns lie in, by stream (empty over TCP).
    """

    __slots__ = ("delivery_counts", "record_batches", "releases", "spans")

    def __init__(
        self,
        record_batches: Iterable[pa.RecordBatch] = (),
        spans: Iterable[Span] = (),
        releases: Iterable[Release] = (),
        delivery_counts: Iterable[int] = (),
    ) -> None:
        """``delivery_counts``: one per run, default 1 each; a 0 (a sidecar that predates
        the field) reads as 1."""
        self.record_batches: tuple[pa.RecordBatch, ...] = tuple(record_batches)
        self.spans: tuple[Span, ...] = tuple(spans)
        self.releases: tuple[Release, ...] = tuple(r for r in releases if r.regions)
        counts = tuple(max(1, c) for c in delivery_counts) or (1,) * len(self.spans)
        self.delivery_counts: tuple[int, ...] = counts
        if not len(self.record_batches) == len(self.spans) == len(self.delivery_counts):
            raise ValueError("a ColumnBatch has one span and delivery count per record batch")

    @property
    def table(self) -> pa.Table:
        """The runs as one table (one chunk per run: no copy)."""
        import pyarrow as pa  # in a process that reads columns: already imported

        from services.records.arrow_batches import SCHEMA

        return pa.Table.from_batches(self.record_batches, schema=SCHEMA)

    def copy(self) -> pa.Table:
        """The records as a table in memory of the application's own (every buffer
        copied), valid after the ack."""
        import pyarrow as pa

        from services.records.arrow_batches import SCHEMA

        memory = pa.default_cpu_memory_manager()
        return pa.Table.from_batches(
            [batch.copy_to(memory) for batch in self.record_batches], schema=SCHEMA
        )

    def __len__(self) -> int:
        return sum(span.count for span in self.spans)

    def __bool__(self) -> bool:
        return any(span.count for span in self.spans)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return iter(self.record_batches)

    def __repr__(self) -> str:
        return (
            f"ColumnBatch({len(self)} records in {len(self.spans)} runs, "
            f"{sum(len(r.regions) for r in self.releases)} shared regions)"
        )


def joined_columns(batches: Sequence[ColumnBatch]) -> ColumnBatch:
    """Several batches as one, runs and releases in order."""
    if len(batches) == 1:
        return batches[0]
    return ColumnBatch(
        chain.from_iterable(b.record_batches for b in batches),
        chain.from_iterable(b.spans for b in batches),
        chain.from_iterable(b.releases for b in batches),
        chain.from_iterable(b.delivery_counts for b in batches),
    )


def by_stream(releases: Iterable[Release]) -> dict[Hashable, dict[int, list[int]]]:
    """Releases grouped by the stream object that delivered them, then by generation, region
    ids in the order given (one ``released`` list per stream message)."""
    out: dict[Hashable, dict[int, list[int]]] = {}
    for release in releases:
        out.setdefault(release.stream, {}).setdefault(release.generation, []).extend(
            release.regions
        )
    return out


def regions_of(released: Mapping[int, Sequence[int]], generation: int) -> list[int]:
    """The region ids of ``released`` (generation → ids) that the running ``generation`` of
    a stream gave: those of an earlier generation died with its ring and are dropped."""
    return list(released.get(generation, ()))
