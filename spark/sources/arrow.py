"""Sidecar records → Arrow record batches, on the executor (no Spark here, only pyarrow).

A ReadRange chunk (``dataservice.common.v1.Record`` messages) becomes one
``pyarrow.RecordBatch`` whose schema is exactly the one Spark expects for the source's
schema (``pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")``; Spark rejects
a batch whose schema differs in any way). Columns are built column-wise from the
messages; JSON values are parsed by Arrow's own JSON reader (C++, one call per chunk) with
the value schema, and only a chunk holding a malformed value falls back to parsing record
by record, where a malformed value becomes null (Spark's ``from_json`` PERMISSIVE mode).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pyarrow.json as pa_json

from dataservice.common.v1 import common_pb2
from dsclient.records.arrow_batches import rows_batch


def _naive_timestamps(dtype: pa.DataType) -> pa.DataType:
    """``dtype`` with time-zone-aware timestamps made naive, recursively: Arrow's JSON
    reader parses ISO-8601 text into naive (UTC) timestamps; a cast adds the zone back."""
    if pa.types.is_timestamp(dtype):
        return pa.timestamp(dtype.unit)
    if pa.types.is_struct(dtype):
        return pa.struct(
            [
                pa.field(f.name, _naive_timestamps(f.type), f.nullable)
                for f in (dtype.field(i) for i in range(dtype.num_fields))
            ]
        )
    if pa.types.is_list(dtype):
        return pa.list_(_naive_timestamps(dtype.value_type))
    return dtype


def _text(values: pa.Array | Sequence[bytes | None]) -> pa.Array:
    """UTF-8 text; invalid bytes become U+FFFD (never a failed task over one bad record).

    Valid text (nearly always) is one cast that checks the UTF-8 in Arrow's C++; only a
    column holding an invalid value is decoded value by value in Python."""
    binary = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array(
            [
                None if v is None else v.decode("utf-8", errors="replace")
                for v in binary.to_pylist()
            ],
            pa.string(),
        )


class JsonValues:
    """Parses JSON values into a struct array of one fixed type."""

    def __init__(self, struct_type: pa.DataType) -> None:
        self.type = struct_type
        naive = _naive_timestamps(struct_type)
        fields = [naive.field(i) for i in range(naive.num_fields)]
        self._parse = pa_json.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
        )
        self._read = pa_json.ReadOptions(use_threads=False, block_size=64 * 1024 * 1024)

    def _table(self, lines: bytes) -> pa.Table:
        return pa_json.read_json(
            io.BytesIO(lines), read_options=self._read, parse_options=self._parse
        )

    def parse(self, values: Sequence[bytes | None]) -> pa.Array:
        if not values:
            return pa.array([], self.type)
        # One line per record: a null (tombstone) value parses as an all-null row, masked
        # below. JSON text may not hold raw newlines inside a value; one that does (pretty
        # printed) makes the fast path fail and is handled by the per-record path.
        lines = b"\n".join(b"{}" if v is None else v for v in values) + b"\n"
        try:
            table = self._table(lines)
            if table.num_rows != len(values):
                raise pa.ArrowInvalid("a value spans several lines")
        except pa.ArrowInvalid:
            return self._parse_each(values)
        mask = pa.array([v is None for v in values], pa.bool_())
        return self._to_struct(table, mask)

    def _to_struct(self, table: pa.Table, mask: pa.Array | None) -> pa.Array:
        columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
        naive = pa.StructArray.from_arrays(
            columns, fields=[table.schema.field(i) for i in range(table.num_columns)], mask=mask
        )
        return naive.cast(self.type)

    def _parse_each(self, values: Sequence[bytes | None]) -> pa.Array:
        rows: list[pa.Array] = []
        for value in values:
            parsed: pa.Array | None = None
            if value is not None:
                # Raw newlines in JSON text can only be whitespace between tokens.
                line = b" ".join(value.splitlines()).strip() + b"\n"
                try:
                    table = self._table(line)
                    if table.num_rows == 1:
                        parsed = self._to_struct(table, None)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    parsed = None  # malformed: a null value, like from_json's PERMISSIVE mode
            rows.append(parsed if parsed is not None else pa.nulls(1, self.type))
        return pa.concat_arrays(rows)


class BatchBuilder:
    """Builds Spark's record batches for one schema and key/value formats."""

    def __init__(self, schema: pa.Schema, key_format: str, value_format: str) -> None:
        self.schema = schema
        self.key_format = key_format
        self.value_format = value_format
        self.include_headers = "headers" in schema.names
        self._json: JsonValues | None = None
        if value_format == "json":
            self._json = JsonValues(schema.field("value").type)

    def build(self, records: Sequence[common_pb2.Record]) -> pa.RecordBatch:
        """A RECORDS chunk as Spark's batch: the records as the mesh's Arrow columns
        (``dsclient.records.arrow_batches.rows_batch``, the builder the sidecar's Arrow
        chunks use too), then the same conversion as :meth:`build_ipc`."""
        # Column by column over one materialised list: a comprehension per field is about
        # twice as fast as one loop appending to six lists.
        recs = list(records)
        batch = rows_batch(
            [r.topic for r in recs],
            [r.partition for r in recs],
            [r.key if r.HasField("key") else None for r in recs],
            [r.value if r.HasField("value") else None for r in recs],
            [r.offset for r in recs],
            [
                r.timestamp.seconds * 1_000_000 + r.timestamp.nanos // 1000
                if r.HasField("timestamp")
                else None
                for r in recs
            ],
            [[{"key": h.key, "value": h.value} for h in r.headers] for r in recs]
            if self.include_headers
            else None,
        )
        return self._to_spark(pa.Table.from_batches([batch]))

    def build_ipc(self, data: bytes, start: int) -> pa.RecordBatch:
        """A chunk in READ_FORMAT_ARROW_IPC (stream.proto: key and value binary, topic
        string, partition int32, offset int64, timestamp timestamp[us, UTC], headers
        list<struct<key string, value binary>>) as Spark's batch: no per-record Python
        except to decode text or parse JSON values."""
        table = pa_ipc.open_stream(pa.py_buffer(data)).read_all().combine_chunks()
        offsets = table.column("offset")
        if table.num_rows and offsets[0].as_py() < start:
            raise ValueError(f"the sidecar returned offset {offsets[0].as_py()} below {start}")
        return self._to_spark(table)

    def _to_spark(self, table: pa.Table) -> pa.RecordBatch:
        """The mesh's Arrow columns (one chunk each) as the source schema's batch: text
        keys, parsed values, the columns Spark asked for in its types."""
        keys = table.column("key").chunk(0) if table.num_rows else pa.array([], pa.binary())
        values = table.column("value").chunk(0) if table.num_rows else pa.array([], pa.binary())
        columns: dict[str, pa.Array] = {
            "key": _text(keys) if self.key_format == "utf8" else keys,
            "value": values if self.value_format == "raw" else self._values(values),
        }
        for name in ("topic", "partition", "offset", "timestamp", "headers"):
            if name in self.schema.names:
                column = table.column(name)
                wanted = self.schema.field(name).type
                array = column.chunk(0) if table.num_rows else pa.array([], column.type)
                columns[name] = array if array.type == wanted else array.cast(wanted)
        return pa.RecordBatch.from_arrays(
            [columns[name] for name in self.schema.names], schema=self.schema
        )

    def _values(self, values: pa.Array | Sequence[bytes | None]) -> pa.Array:
        if self._json is not None:
            return self._json.parse(values.to_pylist() if isinstance(values, pa.Array) else values)
        if self.value_format == "utf8":
            return _text(values)
        return values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
