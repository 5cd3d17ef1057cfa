"""Decode offset-commit records of Kafka's ``__consumer_offsets`` topic (pure). Shared: the
notifier's lag monitor reads the commits' times, the assigner their metadata (a commit
made outside the mesh, issue 23).

Reading commits from the log, as Burrow does, is what tells the evaluator *when* each commit
happened: a consumer that keeps committing the same offset (Burrow STALL) and one that no
longer commits at all (STOP) look the same to an offset poll. Formats (Apache Kafka
``group-coordinator/src/main/resources/common/message``):

* key: int16 record type; types 0 and 1 are ``OffsetCommitKey`` (group, topic: int16-length
  strings; partition: int32); the other types (group metadata, KIP-848 records) are skipped.
* value: int16 version, then ``OffsetCommitValue``: offset int64; leaderEpoch int32 (v3+);
  metadata string; commitTimestamp int64; expireTimestamp int64 (v1 only). v4+ is a
  flexible version (compact strings, tagged fields after the known ones) — Kafka 4.1 writes
  v4, which Burrow 1.2 cannot decode. A null value is a tombstone: the offset was deleted.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSETS_TOPIC = "__consumer_offsets"
# librdkafka settings for a consumer that follows the whole log (the notifier's lag
# monitor, the assigner's commit log). Every group of the cluster commits here, so the log
# is never quiet, and with librdkafka's defaults (a fetch answered as soon as one byte is
# there) each reader's broker thread woke 300-450 times a second on the shared test broker
# while the mesh itself was idle (issue 34). The broker now holds a fetch until it has
# READER_MIN_BYTES or ``wait_ms`` passed: a commit is read at most ``wait_ms`` later.
READER_WAIT_MS = 500
READER_MIN_BYTES = 1 << 20


def reader_overrides(wait_ms: int = READER_WAIT_MS) -> dict[str, object]:
    """A whole-log reader's fetch settings, the broker holding each fetch up to ``wait_ms``."""
    return {"fetch.wait.max.ms": wait_ms, "fetch.min.bytes": READER_MIN_BYTES}


_OFFSET_COMMIT_KEY_TYPES = (0, 1)


@dataclass(frozen=True)
class OffsetCommit:
    group: str
    topic: str
    partition: int
    offset: int | None  # None: the offset was deleted (tombstone)
    commit_timestamp_ms: int = 0
    metadata: str = ""  # the commit's metadata string (services.runtime.commitmeta)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError("record too short")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def int16(self) -> int:
        return self._take(">h")

    def int32(self) -> int:
        return self._take(">i")

    def int64(self) -> int:
        return self._take(">q")

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.data):
                raise ValueError("truncated varint")
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def _bytes(self, length: int) -> str:
        if length < 0:
            return ""
        if self.pos + length > len(self.data):
            raise ValueError("string past the end of the record")
        text = self.data[self.pos : self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def string(self) -> str:
        return self._bytes(self.int16())

    def compact_string(self) -> str:
        return self._bytes(self.uvarint() - 1)


def decode(key: bytes | None, value: bytes | None) -> OffsetCommit | None:
    """The offset commit a ``__consumer_offsets`` record holds, or None for any other
    record. Raises ValueError for a malformed offset-commit record."""
    if not key or len(key) < 2:
        return None
    reader = _Reader(key)
    if reader.int16() not in _OFFSET_COMMIT_KEY_TYPES:
        return None
    group = reader.string()
    topic = reader.string()
    partition = reader.int32()
    if value is None:
        return OffsetCommit(group, topic, partition, None)
    body = _Reader(value)
    version = body.int16()
    if version < 0:
        raise ValueError(f"negative offset commit value version {version}")
    offset = body.int64()
    if version >= 3:
        body.int32()  # leader epoch
    metadata = body.compact_string() if version >= 4 else body.string()
    commit_ts = body.int64()
    return OffsetCommit(group, topic, partition, offset, commit_ts, metadata)
