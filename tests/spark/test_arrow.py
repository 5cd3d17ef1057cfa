"""Sidecar records → the exact Arrow batches Spark accepts for the source's schema."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pytest
from google.protobuf import timestamp_pb2
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dataservice.common.v1 import common_pb2
from spark.sources.arrow import BatchBuilder, _text

UTC = dt.UTC
EVENT = StructType(
    [
        StructField("id", LongType()),
        StructField("kind", StringType()),
        StructField("amount", DoubleType()),
        StructField("ts", TimestampType()),
    ]
)


def schema(key: object, value: object, headers: bool = False) -> StructType:
    fields = [
        StructField("key", key),  # type: ignore[arg-type]
        StructField("value", value),  # type: ignore[arg-type]
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
    ]
    if headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def record(offset: int, key: bytes | None, value: bytes | None, **kw: object) -> common_pb2.Record:
    r = common_pb2.Record(topic="t", partition=3, offset=offset, lease_epoch=7, **kw)  # type: ignore[arg-type]
    if key is not None:
        r.key = key
    if value is not None:
        r.value = value
    return r


def test_raw_records_with_nulls_and_timestamps() -> None:
    arrow_schema = to_arrow_schema(schema(BinaryType(), BinaryType()), timezone="UTC")
    stamp = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=123_456_000)
    records = [
        record(10, b"k", b"v", timestamp=stamp),
        record(11, None, None),  # a tombstone without key, no timestamp
        record(12, b"", b""),  # empty is not null
    ]
    batch = BatchBuilder(arrow_schema, "raw", "raw").build(records)
    assert batch.schema.equals(arrow_schema)
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [10, 11, 12]
    assert [r["key"] for r in rows] == [b"k", None, b""]
    assert [r["value"] for r in rows] == [b"v", None, b""]
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}
    assert rows[0]["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
    assert rows[1]["timestamp"] is None


def test_utf8_keys_and_values_replace_invalid_bytes() -> None:
    arrow_schema = to_arrow_schema(schema(StringType(), StringType()), timezone="UTC")
    batch = BatchBuilder(arrow_schema, "utf8", "utf8").build(
        [record(0, "clé".encode(), b"ok"), record(1, b"\xff", b"bad \xfe")]
    )
    assert batch.schema.equals(arrow_schema)
    rows = batch.to_pylist()
    assert [r["key"] for r in rows] == ["clé", "\ufffd"]
    assert [r["value"] for r in rows] == ["ok", "bad \ufffd"]


def test_utf8_text_from_an_arrow_column_valid_or_not() -> None:
    # ARROW_IPC chunks hand build_ipc a binary column: valid text is one cast, a column
    # with an invalid value falls back to replacing it, nulls stay null either way.
    assert _text(pa.array([b"a", None, "é".encode()], pa.binary())).to_pylist() == [
        "a",
        None,
        "é",
    ]
    assert _text(pa.array([b"ok", b"\xff", None], pa.binary())).to_pylist() == [
        "ok",
        "\ufffd",
        None,
    ]
    assert _text([b"x", None]).type == pa.string()


def test_json_values_parsed_with_the_schema() -> None:
    arrow_schema = to_arrow_schema(schema(BinaryType(), EVENT), timezone="UTC")
    builder = BatchBuilder(arrow_schema, "raw", "json")
    good = [
        record(0, b"a", b'{"id": 1, "kind": "buy", "amount": 2.5, "ts": "2026-01-01T00:00:01Z"}'),
        record(1, b"b", b'{"id": 2, "extra": [1, 2], "ts": "2026-01-01 00:00:02.5"}'),
        record(2, b"c", None),
    ]
    batch = builder.build(good)
    assert batch.schema.equals(arrow_schema)
    values = [r["value"] for r in batch.to_pylist()]
    assert values[0] == {
        "id": 1,
        "kind": "buy",
        "amount": 2.5,
        "ts": dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC),
    }
    assert values[1] == {
        "id": 2,
        "kind": None,
        "amount": None,
        "ts": dt.datetime(2026, 1, 1, 0, 0, 2, 500000, tzinfo=UTC),
    }
    assert values[2] is None  # a tombstone stays null, not a row of nulls


def test_malformed_json_is_null_and_pretty_json_still_parses() -> None:
    arrow_schema = to_arrow_schema(schema(BinaryType(), EVENT), timezone="UTC")
    batch = BatchBuilder(arrow_schema, "raw", "json").build(
        [
            record(0, None, b'{"id": 1}'),
            record(1, None, b"not json"),
            record(2, None, b'{\n  "id": 3,\n  "kind": "view"\n}'),
            record(3, None, b'{"id": "not a number"}'),
            record(4, None, b'{"id": 5}'),
        ]
    )
    assert batch.schema.equals(arrow_schema)
    values = [r["value"] for r in batch.to_pylist()]
    assert values[0] is not None and values[0]["id"] == 1
    assert values[1] is None
    assert values[2] is not None and (values[2]["id"], values[2]["kind"]) == (3, "view")
    assert values[3] is None
    assert values[4] is not None and values[4]["id"] == 5


def test_headers_column() -> None:
    arrow_schema = to_arrow_schema(schema(BinaryType(), BinaryType(), headers=True), timezone="UTC")
    r = record(0, b"k", b"v")
    r.headers.add(key="trace", value=b"\x01")
    batch = BatchBuilder(arrow_schema, "raw", "raw").build([r, record(1, b"k", b"v")])
    assert batch.schema.equals(arrow_schema)
    assert [row["headers"] for row in batch.to_pylist()] == [
        [{"key": "trace", "value": b"\x01"}],
        [],
    ]


def ipc_stream(records: list[common_pb2.Record]) -> bytes:
    """The records as stream.proto's READ_FORMAT_ARROW_IPC documents them."""
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    table = pa.table(
        {
            "key": pa.array([r.key if r.HasField("key") else None for r in records], pa.binary()),
            "value": pa.array(
                [r.value if r.HasField("value") else None for r in records], pa.binary()
            ),
            "topic": pa.array([r.topic for r in records], pa.string()),
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "timestamp": pa.array(
                [
                    r.timestamp.seconds * 1_000_000 + r.timestamp.nanos // 1000
                    if r.HasField("timestamp")
                    else None
                    for r in records
                ],
                pa.int64(),
            ).view(pa.timestamp("us", tz="UTC")),
            "headers": pa.array(
                [[{"key": h.key, "value": h.value} for h in r.headers] for r in records],
                pa.list_(header),
            ),
        }
    )
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_arrow_ipc_chunks_give_the_same_batches_as_records() -> None:
    stamp = timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5_000_000)
    records = [
        record(5, b"a", b'{"id": 1, "kind": "buy", "ts": "2026-01-01T00:00:01Z"}', timestamp=stamp),
        record(6, None, None),
        record(7, b"\xff", b"not json"),
    ]
    records[0].headers.add(key="h", value=b"1")
    data = ipc_stream(records)
    for key_type, value_type, key_format, value_format in [
        (BinaryType(), BinaryType(), "raw", "raw"),
        (StringType(), StringType(), "utf8", "utf8"),
        (BinaryType(), EVENT, "raw", "json"),
    ]:
        for headers in (False, True):
            arrow_schema = to_arrow_schema(
                schema(key_type, value_type, headers=headers), timezone="UTC"
            )
            builder = BatchBuilder(arrow_schema, key_format, value_format)
            from_ipc = builder.build_ipc(data, start=5)
            assert from_ipc.schema.equals(arrow_schema)
            assert from_ipc.to_pylist() == builder.build(records).to_pylist()
    with pytest.raises(ValueError, match="below 6"):
        BatchBuilder(arrow_schema, "raw", "json").build_ipc(data, start=6)
