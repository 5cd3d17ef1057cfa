"""Options of the ``dataservice`` source, validated once into a frozen model. Pure.

    spark.readStream.format("dataservice")
        .option("assigner", "127.0.0.1:7070")       # or .option("consul", "127.0.0.1:8500")
        .option("group", "orders")
        .option("topics", "orders.v1")              # default: every topic of the group
        .option("startingOffsets", "committed")     # earliest | latest | committed | JSON
        .option("maxRecordsPerTrigger", 50000)
        .option("valueFormat", "json")              # raw | utf8 | json
        .option("valueSchema", "id BIGINT, ts TIMESTAMP, amount DOUBLE")
        .load()

Spark hands options over case-insensitively (keys lower-cased); every name below is
matched that way. A bad option fails the query at analysis with one line naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from spark.sources import offsets as off

VALUE_FORMATS = ("raw", "utf8", "json")
KEY_FORMATS = ("raw", "utf8")
READ_FORMATS = ("auto", "records")
STARTING_KEYWORDS = ("earliest", "latest", "committed")
ENDING_KEYWORDS = ("latest",)
DEFAULT_ASSIGNER = "127.0.0.1:7070"
MAX_CHUNK_BYTES = 64 * 1024 * 1024
_HOST_PORT = re.compile(r"^[^\s:,]+:\d{1,5}$")
_DDL_FIELD = re.compile(r"^\s*`?[A-Za-z_][A-Za-z0-9_]*`?\s*:?\s+\S")


class OptionError(ValueError):
    """An option of the ``dataservice`` source is missing or invalid."""


@dataclass(frozen=True)
class SourceOptions:
    group: str
    assigners: tuple[str, ...]  # host:port of assigner replicas (followers redirect)
    consul: str | None  # host:port; the assigner leader is read from Consul's KV
    topics: tuple[str, ...]  # empty = every topic of the group
    # earliest | latest | committed | JSON (offsets.from_json); None = the reader's default
    # (committed for streams, earliest for batch reads)
    starting_offsets: str | None
    ending_offsets: str  # batch reads only: latest | JSON
    max_records_per_trigger: int | None
    max_records_per_partition: int  # input partitions are cut to at most this many records
    value_format: str
    value_schema: str | None  # Spark DDL of the JSON value's fields
    key_format: str
    include_headers: bool
    commit_offsets: bool  # commit each finished batch's end to the group through sidecars
    fail_on_data_loss: bool
    read_timeout_seconds: float  # a read waits this long for a partition's (new) owner
    commit_timeout_seconds: float
    poll_interval_seconds: float  # at most one DescribeGroup per interval while idle
    chunk_bytes: int  # ReadRange max_bytes
    # ReadRange format: auto = ARROW_IPC where the sidecar supports it, else records
    read_format: str
    client_id: str


def _int(options: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError as exc:
        raise OptionError(f"option {name}: not an integer: {raw!r}") from exc
    if value < low:
        raise OptionError(f"option {name}: must be >= {low} (got {value})")
    return value


def _float(options: Mapping[str, str], name: str, default: float, low: float) -> float:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = float(str(raw).strip())
    except ValueError as exc:
        raise OptionError(f"option {name}: not a number: {raw!r}") from exc
    if value < low:
        raise OptionError(f"option {name}: must be >= {low} (got {value})")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: expected true or false (got {raw!r})")


def _choice(options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = str(options.get(name.lower(), default)).strip().lower()
    if value not in allowed:
        raise OptionError(f"option {name}: expected one of {', '.join(allowed)} (got {value!r})")
    return value


def _offsets_spec(
    options: Mapping[str, str], name: str, default: str | None, words: tuple[str, ...]
) -> str | None:
    raw = options.get(name.lower(), default)
    if raw is None:
        return None
    value = str(raw).strip()
    if value.lower() in words:
        return value.lower()
    try:
        off.from_json(value, allow_special=True)
    except off.OffsetsError as exc:
        raise OptionError(
            f"option {name}: expected {', '.join(words)} or JSON "
            f'{{"topic": {{"0": offset}}}} ({exc})'
        ) from exc
    return value


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark's (lower-cased) option map."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    group = opts.get("group", "").strip()
    if not group:
        raise OptionError("option group: required (the consumer group whose sidecars to read)")
    assigners = tuple(a.strip() for a in opts.get("assigner", DEFAULT_ASSIGNER).split(",") if a)
    for address in assigners:
        if not _HOST_PORT.match(address):
            raise OptionError(f"option assigner: expected HOST:PORT[,HOST:PORT] (got {address!r})")
    consul = opts.get("consul", "").strip() or None
    if consul is not None and not _HOST_PORT.match(consul.removeprefix("http://")):
        raise OptionError(f"option consul: expected HOST:PORT (got {consul!r})")
    topics = tuple(sorted({t.strip() for t in opts.get("topics", "").split(",") if t.strip()}))
    value_format = _choice(opts, "valueFormat", "raw", VALUE_FORMATS)
    value_schema = opts.get("valueschema", "").strip() or None
    if value_format == "json":
        if value_schema is None:
            raise OptionError("option valueSchema: required with valueFormat=json (Spark DDL)")
        if not _DDL_FIELD.match(value_schema):
            raise OptionError(
                f"option valueSchema: expected Spark DDL like 'id BIGINT, ts TIMESTAMP' "
                f"(got {value_schema!r})"
            )
    elif value_schema is not None:
        raise OptionError("option valueSchema: only with valueFormat=json")
    chunk_bytes = _int(opts, "chunkBytes", 4 * 1024 * 1024, 1024)
    assert chunk_bytes is not None
    if chunk_bytes > MAX_CHUNK_BYTES:
        raise OptionError(f"option chunkBytes: at most {MAX_CHUNK_BYTES}")
    max_per_partition = _int(opts, "maxRecordsPerPartition", 500_000, 1)
    assert max_per_partition is not None
    return SourceOptions(
        group=group,
        assigners=assigners,
        consul=consul.removeprefix("http://") if consul else None,
        topics=topics,
        starting_offsets=_offsets_spec(opts, "startingOffsets", None, STARTING_KEYWORDS),
        ending_offsets=_offsets_spec(opts, "endingOffsets", "latest", ENDING_KEYWORDS) or "latest",
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", None, 1),
        max_records_per_partition=max_per_partition,
        value_format=value_format,
        value_schema=value_schema,
        key_format=_choice(opts, "keyFormat", "raw", KEY_FORMATS),
        include_headers=_bool(opts, "includeHeaders", False),
        commit_offsets=_bool(opts, "commitOffsets", True),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        read_timeout_seconds=_float(opts, "readTimeoutSeconds", 120.0, 1.0),
        commit_timeout_seconds=_float(opts, "commitTimeoutSeconds", 30.0, 0.0),
        poll_interval_seconds=_float(opts, "pollIntervalMs", 500.0, 0.0) / 1000.0,
        chunk_bytes=chunk_bytes,
        read_format=_choice(opts, "readFormat", "auto", READ_FORMATS),
        client_id=opts.get("clientid", "").strip() or f"spark-{group}",
    )


def schema_ddl(options: SourceOptions) -> str:
    """The source's schema, as Spark's Kafka source has it (key, value, topic, partition,
    offset, timestamp[, headers]) with key and value typed by the formats."""
    key = "string" if options.key_format == "utf8" else "binary"
    if options.value_format == "json":
        value = f"struct<{options.value_schema}>"
    elif options.value_format == "utf8":
        value = "string"
    else:
        value = "binary"
    columns = [
        f"key {key}",
        f"value {value}",
        "topic string",
        "partition int",
        "offset bigint",
        "timestamp timestamp",
    ]
    if options.include_headers:
        columns.append("headers array<struct<key: string, value: binary>>")
    return ", ".join(columns)
