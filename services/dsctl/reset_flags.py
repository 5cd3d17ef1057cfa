"""``dsctl offsets reset``'s flags, as ``kafka-consumer-groups --reset-offsets`` has them,
turned into a ``ResetOffsetsRequest`` (pure; no I/O).

* one strategy: ``--to-earliest``, ``--to-latest``, ``--to-datetime``, ``--to-offset``,
  ``--shift-by``;
* ``--topic T`` (every partition of T) or ``--topic T:P,P,...`` (those partitions),
  repeatable; none = every topic of the group;
* ``--to-datetime`` takes ISO 8601 like Kafka's tool (``2026-01-31T12:00:00.000``), with
  an optional zone (``Z``, ``+01:00``); without one it is local time, as Kafka's tool
  reads it.

Every mistake is a :class:`~services.dsctl.admin_client.CliError` (exit 1) naming the flag.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from dataservice.assigner.v1 import admin_pb2
from services.dsctl.admin_client import CliError, ExitCode

STRATEGY_NAMES = {
    admin_pb2.RESET_STRATEGY_EARLIEST: "earliest",
    admin_pb2.RESET_STRATEGY_LATEST: "latest",
    admin_pb2.RESET_STRATEGY_TIMESTAMP: "datetime",
    admin_pb2.RESET_STRATEGY_ABSOLUTE: "offset",
    admin_pb2.RESET_STRATEGY_SHIFT_BY: "shift-by",
}


@dataclass(frozen=True)
class ResetFlags:
    to_earliest: bool = False
    to_latest: bool = False
    to_datetime: str | None = None
    to_offset: int | None = None
    shift_by: int | None = None
    topics: Sequence[str] = ()


@dataclass(frozen=True)
class TopicSelection:
    topic: str
    partitions: tuple[int, ...]  # empty = every partition of the topic


def parse_topic(text: str) -> TopicSelection:
    """``T`` or ``T:P,P,...``."""
    topic, sep, rest = text.partition(":")
    if not topic:
        raise CliError(f"--topic {text!r}: name a topic (TOPIC or TOPIC:P,P,...)", ExitCode.ERROR)
    if not sep:
        return TopicSelection(topic, ())
    try:
        partitions = tuple(sorted({int(p) for p in rest.split(",") if p.strip()}))
    except ValueError:
        raise CliError(
            f"--topic {text!r}: partitions are numbers, e.g. {topic}:0,1,2", ExitCode.ERROR
        ) from None
    if not partitions or any(p < 0 for p in partitions):
        raise CliError(f"--topic {text!r}: partitions are numbers >= 0", ExitCode.ERROR)
    return TopicSelection(topic, partitions)


def parse_datetime(text: str) -> int:
    """ISO 8601 → ms since the Unix epoch; local time when no zone is given."""
    try:
        when = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--to-datetime {text!r}: expected ISO 8601, e.g. 2026-01-31T12:00:00.000 or "
            "2026-01-31T12:00:00Z",
            ExitCode.ERROR,
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as kafka-consumer-groups reads it
    return int(when.timestamp() * 1000)


def strategy_of(flags: ResetFlags) -> tuple[admin_pb2.ResetStrategy.ValueType, int]:
    """The one strategy the flags name, and its value."""
    chosen: list[tuple[admin_pb2.ResetStrategy.ValueType, int]] = []
    if flags.to_earliest:
        chosen.append((admin_pb2.RESET_STRATEGY_EARLIEST, 0))
    if flags.to_latest:
        chosen.append((admin_pb2.RESET_STRATEGY_LATEST, 0))
    if flags.to_datetime is not None:
        chosen.append((admin_pb2.RESET_STRATEGY_TIMESTAMP, parse_datetime(flags.to_datetime)))
    if flags.to_offset is not None:
        chosen.append((admin_pb2.RESET_STRATEGY_ABSOLUTE, flags.to_offset))
    if flags.shift_by is not None:
        chosen.append((admin_pb2.RESET_STRATEGY_SHIFT_BY, flags.shift_by))
    if len(chosen) != 1:
        raise CliError(
            "name exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, "
            f"--shift-by ({len(chosen)} given)",
            ExitCode.ERROR,
        )
    return chosen[0]


def reset_request(
    group: str, flags: ResetFlags, *, dry_run: bool, request_id: str = ""
) -> admin_pb2.ResetOffsetsRequest:
    """The request the flags mean. Whole topics go in ``topics``; as soon as one
    ``--topic`` names partitions, every selection goes in ``targets`` (the server reads
    ``topics`` only when ``targets`` is empty) — a whole topic then needs its partitions,
    so mixing the two forms is refused rather than guessed at."""
    strategy, value = strategy_of(flags)
    selections = [parse_topic(t) for t in flags.topics]
    request = admin_pb2.ResetOffsetsRequest(
        group=group, strategy=strategy, value=value, dry_run=dry_run, request_id=request_id
    )
    explicit = [s for s in selections if s.partitions]
    if explicit and len(explicit) != len(selections):
        raise CliError(
            "--topic: name partitions for every topic (T:P,...) or for none", ExitCode.ERROR
        )
    if explicit:
        request.targets.extend(
            admin_pb2.ResetTarget(topic=s.topic, partition=p)
            for s in explicit
            for p in s.partitions
        )
    else:
        request.topics.extend(dict.fromkeys(s.topic for s in selections))
    return request
