"""Offsets of the ``dataservice`` source, and how a micro-batch is cut into reads. Pure.

An offset is the next offset to read per Kafka partition, ``{(topic, partition): offset}``.
In Spark's checkpoint it is JSON ``{"topic": {"partition": offset}}`` with string keys,
topics sorted by name and partitions by number: Spark compares offsets as JSON text, so two
equal offsets must serialise to the same string (ARCHITECTURE §10).

``limit_offsets`` is the admission control (a ``maxRecordsPerTrigger`` read limit split over
partitions in proportion to what each has available, like Spark's Kafka source, but exact:
the batch holds precisely ``min(limit, available)`` records). ``plan_ranges`` cuts each
partition's ``[start, end)`` into input partitions of at most ``max_records`` records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from services.runtime.topic_partition import TP

Offsets = dict[TP, int]

# Spark's Kafka source conventions for per-partition starting offsets in JSON.
EARLIEST = -2
LATEST = -1


class OffsetsError(ValueError):
    """An offsets value that cannot be used (malformed JSON, negative offset, ...)."""


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """The canonical checkpoint form: topics by name, partitions by number, string keys."""
    by_topic: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, {})[partition] = offset
    return {
        topic: {str(p): by_topic[topic][p] for p in sorted(by_topic[topic])}
        for topic in sorted(by_topic)
    }


def dumps(offsets: Mapping[TP, int]) -> str:
    return json.dumps(to_json(offsets), separators=(",", ":"))


def from_json(value: Any, *, allow_special: bool = False) -> Offsets:
    """Offsets from their JSON form (a dict, or a JSON string). With ``allow_special``,
    -2 (earliest) and -1 (latest) are accepted as per-partition values."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise OffsetsError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise OffsetsError('expected {"topic": {"partition": offset}}')
    out: Offsets = {}
    lowest = EARLIEST if allow_special else 0
    for topic, partitions in value.items():
        if not isinstance(topic, str) or not topic:
            raise OffsetsError(f"bad topic name {topic!r}")
        if not isinstance(partitions, dict):
            raise OffsetsError(f"{topic}: expected {{partition: offset}}")
        for key, offset in partitions.items():
            try:
                partition = int(key)
            except (TypeError, ValueError) as exc:
                raise OffsetsError(f"{topic}: bad partition {key!r}") from exc
            if partition < 0:
                raise OffsetsError(f"{topic}: bad partition {key!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < lowest:
                raise OffsetsError(f"{topic}[{partition}]: bad offset {offset!r}")
            out[TP(topic, partition)] = offset
    return out


def limit_offsets(start: Mapping[TP, int], latest: Mapping[TP, int], max_records: int) -> Offsets:
    """End offsets for a batch of at most ``max_records`` records from ``start``.

    Each partition gets a share proportional to what it has available (``latest - start``),
    rounded down, and the records left over go to the largest remainders (ties: topic and
    partition order), so the batch holds exactly ``min(max_records, available)`` records.
    A partition never goes below its start. ``start`` must name every partition of
    ``latest`` (see :func:`merge_new_partitions`).
    """
    if max_records < 0:
        raise OffsetsError("max_records must be >= 0")
    if missing := set(latest) - set(start):
        raise OffsetsError(f"no start offset for {sorted(missing)}")
    available = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(available.values())
    if total <= max_records:
        return {tp: start[tp] + available[tp] for tp in latest}
    shares: dict[TP, int] = {}
    remainders: list[tuple[float, TP]] = []
    for tp, size in available.items():
        exact = max_records * size / total
        shares[tp] = math.floor(exact)
        remainders.append((exact - shares[tp], tp))
    left = max_records - sum(shares.values())
    for _, tp in sorted(remainders, key=lambda item: (-item[0], item[1])):
        if left <= 0:
            break
        if shares[tp] < available[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: start[tp] + shares[tp] for tp in latest}


@dataclass(frozen=True)
class Range:
    """Records ``[from_offset, to_offset)`` of one partition: one Spark input partition."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int

    @property
    def size(self) -> int:
        return self.to_offset - self.from_offset


def split_range(whole: Range, max_records: int) -> list[Range]:
    """``whole`` in ``ceil(size / max_records)`` contiguous pieces of near-equal size."""
    if whole.size <= 0:
        return []
    if max_records <= 0 or whole.size <= max_records:
        return [whole]
    pieces = math.ceil(whole.size / max_records)
    base, extra = divmod(whole.size, pieces)
    out = []
    begin = whole.from_offset
    for i in range(pieces):
        end = begin + base + (1 if i < extra else 0)
        out.append(Range(whole.topic, whole.partition, begin, end))
        begin = end
    return out


def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int], max_records: int) -> list[Range]:
    """The reads of a batch from ``start`` to ``end``: every partition with records, in
    topic and partition order, each cut into pieces of at most ``max_records`` records."""
    ranges: list[Range] = []
    for tp in sorted(end):
        begin = start.get(tp, 0)
        ranges.extend(split_range(Range(tp[0], tp[1], begin, end[tp]), max_records))
    return ranges


def merge_new_partitions(start: Mapping[TP, int], partitions: Iterable[TP]) -> Offsets:
    """``start`` with partitions it does not know (added to a topic since) at offset 0: a new
    partition is read from its beginning (the read moves up to the log start if needed)."""
    merged = dict(start)
    for tp in partitions:
        merged.setdefault(tp, 0)
    return merged
