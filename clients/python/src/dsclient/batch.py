"""What the application gets from a fetch, and how what it acks becomes range acks.

A :class:`Batch` is the records of one fetch (or of what one Stream delivered) together
with the offset ranges (:class:`Span`\\ s) they were delivered in, so acking it whole costs
one ``RangeAck`` per partition run. Any other collection of records is cut into runs of
consecutive offsets (:func:`spans_of`); a sidecar's answer, which names the ranges it
refused, is matched back to the spans sent (:func:`accepted_spans`).

Pure code: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, pairwise, repeat
from operator import add, attrgetter, ne, or_
from typing import Any, overload

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import Columns, DsRecord, from_record


@dataclass(frozen=True)
class Span:
    """Records of one partition delivered together: acked with one RangeAck."""

    topic: str
    partition: int
    lease_epoch: int
    from_offset: int
    to_offset: int  # one past the last record's offset
    count: int

    def range_ack(self) -> stream_pb2.RangeAck:
        return stream_pb2.RangeAck(
            topic=self.topic,
            partition=self.partition,
            lease_epoch=self.lease_epoch,
            from_offset=self.from_offset,
            to_offset=self.to_offset,
        )


class Batch(Sequence[DsRecord]):
    """The records of one fetch (or of what one Stream delivered), as an immutable sequence
    of :class:`~dsclient.records.batches.DsRecord`.

    A batch knows the offset ranges it was delivered in (:attr:`spans`), so acking it
    whole costs one range ack per partition run. It holds the records as columns and
    builds each record as it is read (see :class:`~dsclient.records.batches.Columns`):
    iterate it rather than keep ``list(batch)`` around when it is large. Records are in
    offset order per partition; an empty batch is false. Indexing by a slice gives a
    list. A batch compares equal to a list or tuple of the same records, and is not
    hashable.

    Attributes:
        spans: The offset ranges the records were delivered in, one per partition run
            (what :meth:`~dsclient.DsClient.ack` sends for the whole batch).
    """

    __slots__ = ("_ends", "_parts", "spans")

    def __init__(
        self,
        parts: Iterable[Columns | Sequence[DsRecord]] = (),
        spans: Iterable[Span] = (),
    ) -> None:
        self._parts = [p for p in parts if len(p)]
        self._ends = list(accumulate(map(len, self._parts)))
        self.spans = tuple(spans)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __iter__(self) -> Iterator[DsRecord]:
        return chain.from_iterable(
            p.records() if isinstance(p, Columns) else iter(p) for p in self._parts
        )

    @overload
    def __getitem__(self, index: int) -> DsRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[DsRecord]: ...

    def __getitem__(self, index: int | slice) -> DsRecord | list[DsRecord]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("batch index out of range")
        k = bisect_right(self._ends, index)
        part = self._parts[k]
        local = index - (self._ends[k - 1] if k else 0)
        return part.record(local) if isinstance(part, Columns) else part[local]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Batch | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Batch({list(self)!r})"


def decode_batches(batches: Iterable[stream_pb2.RecordBatch]) -> Batch:
    """RecordBatch messages as one Batch."""
    return batch_of(map(Columns.of, batches))


def batch_of(decoded: Iterable[Columns]) -> Batch:
    parts = []
    spans = []
    for columns in decoded:
        if not len(columns):
            continue
        parts.append(columns)
        offsets = columns.offsets
        spans.append(
            Span(
                columns.topic,
                columns.partition,
                columns.lease_epoch,
                offsets[0],
                offsets[-1] + 1,
                len(offsets),
            )
        )
    return Batch(parts, spans)


_ACK_KEY = attrgetter("topic", "partition", "lease_epoch")
_OFFSET = attrgetter("offset")


def spans_of(records: Sequence[Any]) -> list[Span]:
    """Records (DsRecord or Record messages) as runs of consecutive offsets of one
    partition and epoch, in the order given: what one RangeAck each may acknowledge."""
    if isinstance(records, Batch):
        return list(records.spans)
    n = len(records)
    if n == 0:
        return []
    keys = list(map(_ACK_KEY, records))
    offsets = list(map(_OFFSET, records))
    followers = map(add, offsets, repeat(1))
    breaks = map(or_, map(ne, keys[1:], keys[:-1]), map(ne, offsets[1:], followers))
    bounds = [0, *compress(range(1, n), breaks), n]
    return [
        Span(*keys[lo], offsets[lo], offsets[hi - 1] + 1, hi - lo) for lo, hi in pairwise(bounds)
    ]


# A range ack's identity, the same on a Span and on a RangeAck message.
_RANGE_KEY = attrgetter("topic", "partition", "lease_epoch", "from_offset", "to_offset")


def accepted_spans(
    spans: Sequence[Span], rejected: Iterable[stream_pb2.RejectedRangeAck]
) -> list[bool]:
    """For each of ``spans`` (range acks sent in this order), whether it was accepted: a
    refused range is matched to the first span sent with its key not yet matched."""
    refused = Counter(_RANGE_KEY(r.ack) for r in rejected)
    out = []
    for key in map(_RANGE_KEY, spans):
        out.append(refused[key] <= 0)
        refused[key] -= 1
    return out


def counted(spans: Sequence[Span], accepted: Sequence[bool]) -> int:
    return sum(span.count for span, ok in zip(spans, accepted, strict=True) if ok)


def joined(batches: list[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    return Batch(
        [part for b in batches for part in b._parts], [span for b in batches for span in b.spans]
    )


def received(message: stream_pb2.FetchResponse | stream_pb2.StreamBatch) -> Batch:
    """The records of a Fetch response or Stream batch; Record messages (a sidecar that
    predates DELIVERY_FORMAT_BATCHES) are converted one by one."""
    if message.batches or not message.records:
        return decode_batches(message.batches)
    records = [from_record(r) for r in message.records]
    return Batch([records], spans_of(records))
