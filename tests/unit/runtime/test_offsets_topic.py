"""Decoding ``__consumer_offsets`` records, every value version Kafka has written."""

from __future__ import annotations

import struct

import pytest

from services.runtime.offsets_topic import OffsetCommit, decode


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def commit_record(version: int, key_type: int = 1) -> tuple[bytes, bytes]:
    """The bytes of OffsetCommitKey/Value as Kafka's generated serializers write them."""
    key = struct.pack(">h", key_type) + _string("g1") + _string("orders") + struct.pack(">i", 7)
    body = struct.pack(">hq", version, 1234)
    if version >= 3:
        body += struct.pack(">i", 5)  # leader epoch
    if version >= 4:
        body += bytes([len(b"meta") + 1]) + b"meta"  # compact string
    else:
        body += _string("meta")
    body += struct.pack(">q", 1_700_000_000_123)
    if version == 1:
        body += struct.pack(">q", -1)  # expire timestamp
    if version >= 4:
        body += b"\x00"  # no tagged fields
    return key, body


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_value_version(version: int) -> None:
    key, value = commit_record(version)
    assert decode(key, value) == OffsetCommit("g1", "orders", 7, 1234, 1_700_000_000_123, "meta")


def test_tombstone_and_other_record_types() -> None:
    key, _value = commit_record(3)
    assert decode(key, None) == OffsetCommit("g1", "orders", 7, None)
    group_metadata_key = struct.pack(">h", 2) + _string("g1")
    assert decode(group_metadata_key, b"\x00\x03whatever") is None
    assert decode(None, None) is None


def test_truncated_value_is_an_error() -> None:
    key, value = commit_record(3)
    with pytest.raises(ValueError, match=r"short|past"):
        decode(key, value[:9])
