"""StreamService's requests checked: the bounds of every field, and who may call.

Pure: each check raises ``INVALID_ARGUMENT`` (:func:`dsclient.reasons.invalid`, naming the
field) for a field out of its bounds, or ``FAILED_PRECONDITION``/``GROUP_NOT_SERVED`` for a
caller of another group, and returns what the handler serves with. The handlers
(``fetch_rpc.py``, ``ack_rpcs.py``, ``stream_rpc.py``, ``range_rpcs.py``) check a request
before they touch the sidecar's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason, invalid
from services.runtime.topic_partition import TP

DEFAULT_MAX_RECORDS = 500
MAX_RECORDS = 100_000
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_WAIT = 0.5
MAX_WAIT = 30.0
MAX_ACKS = 100_000
# ReadRange
DEFAULT_RANGE_CHUNK_BYTES = 4 * 1024 * 1024
MAX_COMMITS = 100_000
MAX_NACK_DELAY = 12 * 3600.0  # seconds, as a visibility timeout at most
MAX_LINGER = 1.0  # seconds: a Stream's linger (StreamOpen.linger) at most
_FORMATS = (
    stream_pb2.DELIVERY_FORMAT_UNSPECIFIED,
    stream_pb2.DELIVERY_FORMAT_RECORDS,
    stream_pb2.DELIVERY_FORMAT_BATCHES,
    stream_pb2.DELIVERY_FORMAT_ARROW_SHM,
)
SHM_LOCAL_ONLY = "DELIVERY_FORMAT_ARROW_SHM is served on Stream over the local socket only"


def check_caller(client_id: str, group: str, served_group: str) -> None:
    """A caller names itself and this sidecar's group (``served_group``)."""
    if not client_id:
        raise invalid("client_id", "must not be empty")
    if not group:
        raise invalid("group", "must not be empty")
    if group != served_group:
        raise DsError(
            Reason.GROUP_NOT_SERVED,
            f"this sidecar serves group {served_group!r}, not {group!r}",
            metadata={"group": group, "served_group": served_group},
        )


def fetch_limits(request: stream_pb2.FetchRequest) -> tuple[int, int, float, int]:
    """A Fetch's max_records, max_bytes, max_wait (seconds) and delivery format, defaults
    filled in; ``DELIVERY_FORMAT_ARROW_SHM`` is refused (Stream only)."""
    max_records = request.max_records or DEFAULT_MAX_RECORDS
    if not 0 < max_records <= MAX_RECORDS:
        raise invalid("max_records", f"must be between 0 and {MAX_RECORDS}")
    max_bytes = request.max_bytes or DEFAULT_MAX_BYTES
    if not 0 < max_bytes <= MAX_BYTES:
        raise invalid("max_bytes", f"must be between 0 and {MAX_BYTES}")
    max_wait = (
        request.max_wait.seconds + request.max_wait.nanos / 1e9  # not ToTimedelta(): it
        if request.HasField("max_wait")  # overflows on a Duration outside its range
        else DEFAULT_MAX_WAIT
    )
    if not 0 <= max_wait <= MAX_WAIT:
        raise invalid("max_wait", f"must be between 0 and {MAX_WAIT:.0f} s")
    delivery = validate_format("format", request.format)
    if delivery == stream_pb2.DELIVERY_FORMAT_ARROW_SHM:
        raise invalid("format", SHM_LOCAL_ONLY)
    return max_records, max_bytes, max_wait, delivery


def validate_credit(prefix: str, credit: stream_pb2.StreamCredit) -> None:
    if credit.records < 0:
        raise invalid(f"{prefix}.records", "must be >= 0")
    if credit.bytes < 0:
        raise invalid(f"{prefix}.bytes", "must be >= 0")


# Each field an ack (RecordAck), a range (RangeAck) or a commit (CommitOffsets' offsets)
# must hold: its name, the bound, and what INVALID_ARGUMENT says when it does not.
_Bound = tuple[str, Callable[[Any], bool], str]
_PARTITION_BOUNDS: tuple[_Bound, ...] = (
    ("topic", lambda item: bool(item.topic), "must not be empty"),
    ("partition", lambda item: item.partition >= 0, "must be >= 0"),
)
_RECORD_ACK_BOUNDS: tuple[_Bound, ...] = (
    *_PARTITION_BOUNDS,
    ("offset", lambda item: item.offset >= 0, "must be >= 0"),
)
_RANGE_ACK_BOUNDS: tuple[_Bound, ...] = (
    *_PARTITION_BOUNDS,
    ("from_offset", lambda item: item.from_offset >= 0, "must be >= 0"),
    ("to_offset", lambda item: item.to_offset > item.from_offset, "must be > from_offset"),
)
_COMMIT_BOUNDS: tuple[_Bound, ...] = (
    *_RECORD_ACK_BOUNDS,
    ("lease_epoch", lambda item: item.lease_epoch >= 0, "must be >= 0"),
)


def _check_bounds(field_name: str, item: Any, bounds: tuple[_Bound, ...]) -> None:
    """INVALID_ARGUMENT naming ``field_name.FIELD`` for the first of ``bounds`` that
    ``item`` does not hold."""
    for name, holds, why in bounds:
        if not holds(item):
            raise invalid(f"{field_name}.{name}", why)


def _validate_each(field_name: str, items: Any, bounds: tuple[_Bound, ...]) -> None:
    """At most MAX_ACKS ``items`` in one message, each within ``bounds``."""
    if len(items) > MAX_ACKS:
        raise invalid(field_name, f"at most {MAX_ACKS} per message")
    for item in items:
        _check_bounds(field_name, item, bounds)


def validate_acks(field_name: str, acks: Any) -> None:
    _validate_each(field_name, acks, _RECORD_ACK_BOUNDS)


def validate_ranges(field_name: str, ranges: Any) -> None:
    _validate_each(field_name, ranges, _RANGE_ACK_BOUNDS)


def _duration_within(field_name: str, message: Any, field: str, most: float) -> float:
    """``message``'s Duration ``field`` in seconds (unset = 0); INVALID_ARGUMENT naming
    ``field_name`` out of [0, ``most``]."""
    if not message.HasField(field):
        return 0.0
    # From the fields, not ToTimedelta(): a Duration outside timedelta's range (any int64
    # seconds may come over the wire) raised OverflowError, which the caller saw as UNKNOWN.
    duration = getattr(message, field)
    seconds = float(duration.seconds + duration.nanos / 1e9)
    if not 0 <= seconds <= most:
        raise invalid(field_name, f"must be between 0 and {most:.0f} s")
    return seconds


def validate_delay(field_name: str, message: Any) -> float:
    """A nack's delay in seconds (unset = 0); INVALID_ARGUMENT out of [0, 12 h]."""
    return _duration_within(field_name, message, "delay", MAX_NACK_DELAY)


def validate_linger(field_name: str, opened: stream_pb2.StreamOpen) -> float:
    """A Stream's linger in seconds (unset = 0); INVALID_ARGUMENT out of [0, 1 s]."""
    return _duration_within(field_name, opened, "linger", MAX_LINGER)


def validate_format(field_name: str, value: int) -> int:
    """The delivery format; an unknown format is INVALID_ARGUMENT."""
    if value not in _FORMATS:
        raise invalid(field_name, f"unknown delivery format {value}")
    return value


def validate_range(request: stream_pb2.ReadRangeRequest) -> tuple[TP, int]:
    """A ReadRange's partition and chunk size (max_bytes, defaulted)."""
    if not request.topic:
        raise invalid("topic", "must not be empty")
    if request.partition < 0:
        raise invalid("partition", "must be >= 0")
    if request.from_offset < 0:
        raise invalid("from_offset", "must be >= 0")
    if request.to_offset < request.from_offset:
        raise invalid("to_offset", "must be >= from_offset")
    if request.max_bytes < 0 or request.max_bytes > MAX_BYTES:
        raise invalid("max_bytes", f"must be between 0 and {MAX_BYTES}")
    if request.format not in (
        stream_pb2.READ_FORMAT_UNSPECIFIED,
        stream_pb2.READ_FORMAT_RECORDS,
        stream_pb2.READ_FORMAT_ARROW_IPC,
    ):
        raise invalid("format", f"unknown format {request.format}")
    return TP(request.topic, request.partition), request.max_bytes or DEFAULT_RANGE_CHUNK_BYTES


def validate_commits(request: stream_pb2.CommitOffsetsRequest) -> None:
    """A CommitOffsets' offsets: at least one, at most MAX_COMMITS, each partition once."""
    if not request.offsets:
        raise invalid("offsets", "name at least one offset")
    if len(request.offsets) > MAX_COMMITS:
        raise invalid("offsets", f"at most {MAX_COMMITS} per call")
    seen: set[TP] = set()
    for commit in request.offsets:
        _check_bounds("offsets", commit, _COMMIT_BOUNDS)
        tp = TP(commit.topic, commit.partition)
        if tp in seen:
            raise invalid("offsets", f"{tp.topic}[{tp.partition}] named twice")
        seen.add(tp)
