"""``dsctl dlq list|show|replay|purge GROUP``: a group's dead-letter topic (issue 39).

The sidecars of a group with ``dead_letter_topic`` set produce each record given up past
``max_deliveries`` there, with ``ds-dlq-*`` headers naming its origin (topic, partition,
offset, timestamp, deliveries, last error, client, group: ``consumer_sidecar/dead_letter.py``).
These commands read that topic straight from Kafka:

* ``list``: per partition, the records kept (depth) and the age of the oldest;
* ``show``: the records of an offset range, with their origin;
* ``replay``: produces the records of an offset range again, to their origin topic (the
  group's clients receive them through the mesh, as new records) or to ``--to-topic``;
  ``--since``/``--until`` (when they were dead-lettered: an ISO 8601 time, or an age like
  ``30m``), ``--origin-offset``, ``--key`` and ``--client`` narrow it; the records keep
  their headers;
* ``purge``: deletes the records below an offset (Kafka's DeleteRecords).

Replay and purge are separate on purpose: replay first, check, then purge what was
replayed, so a record is never both purged and not replayed.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.table import Table

from services.dsctl.admin_client import EXIT_CODES_HELP, ExitCode

console = Console()
err_console = Console(stderr=True)

DEFAULT_TEMPLATE = "{group}.dlq"
ORIGIN_PREFIX = "ds-dlq-"


class Output(StrEnum):
    table = "table"
    json = "json"


dlq_app = typer.Typer(
    help="A group's dead-letter topic: what it holds, replay, purge.",
    no_args_is_help=True,
    epilog=EXIT_CODES_HELP,
)

GroupArg = Annotated[str, typer.Argument(help="The consumer group.")]
BootstrapOption = Annotated[
    str,
    typer.Option("--bootstrap", envvar="DS_BOOTSTRAP", help="Kafka bootstrap servers."),
]
TopicOption = Annotated[
    str,
    typer.Option(
        "--topic",
        envvar="DS_DEAD_LETTER_TOPIC",
        help="The dead-letter topic ({group} = the group), as the sidecars' dead_letter_topic.",
    ),
]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="table or json.")]
PartitionOption = Annotated[
    int | None, typer.Option("--partition", help="Only this partition of the dead-letter topic.")
]
FromOption = Annotated[
    int | None, typer.Option("--from-offset", help="First offset (default: the oldest kept).")
]
ToOption = Annotated[
    int | None, typer.Option("--to-offset", help="End offset, exclusive (default: the end).")
]


SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        help="Only records dead-lettered at or after this time: ISO 8601 (UTC unless it "
        "names a zone) or an age such as 90s, 30m, 2h, 1d.",
    ),
]
UntilOption = Annotated[
    str | None,
    typer.Option("--until", help="Only records dead-lettered before this time (as --since)."),
]
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def when_ms(text: str, now: datetime.datetime) -> int:
    """A --since/--until value as ms since the epoch (pure): an ISO 8601 time (UTC unless
    it names a zone) or an age before ``now`` (``90s``, ``30m``, ``2h``, ``1d``). Raises
    typer.BadParameter."""
    text = text.strip()
    if len(text) > 1 and text[-1] in _AGE_UNITS and text[:-1].isdigit():
        at = now - datetime.timedelta(seconds=int(text[:-1]) * _AGE_UNITS[text[-1]])
    else:
        try:
            at = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise typer.BadParameter(
                f"{text[:40]!r} is neither an ISO 8601 time nor an age like 30m, 2h or 1d"
            ) from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=datetime.UTC)
    return int(at.timestamp() * 1000)


def from_times(
    watermarks: dict[int, tuple[int, int]], found: dict[int, int]
) -> dict[int, tuple[int, int]]:
    """Watermarks with each partition's low mark moved up to the first offset at or after
    --since (``found``: Kafka's answer per partition, -1 = none that late) (pure)."""
    out = {}
    for p, (low, high) in watermarks.items():
        first = found.get(p, low)
        out[p] = (high, high) if first < 0 else (max(low, first), high)
    return out


@dataclass(frozen=True)
class Range:
    """Offsets [lo, hi) of one partition of the dead-letter topic."""

    partition: int
    lo: int
    hi: int


def ranges(
    watermarks: dict[int, tuple[int, int]],
    partition: int | None,
    lo: int | None,
    hi: int | None,
) -> list[Range]:
    """What to read, per partition, clipped to what Kafka keeps (pure)."""
    out = []
    for p, (low, high) in sorted(watermarks.items()):
        if partition is not None and p != partition:
            continue
        start = low if lo is None else max(lo, low)
        end = high if hi is None else min(hi, high)
        if start < end:
            out.append(Range(p, start, end))
    return out


def origin_of(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """The ``ds-dlq-*`` headers of a record, names without the prefix (pure)."""
    out = {}
    for name, value in headers or []:
        if name.startswith(ORIGIN_PREFIX) and not name.startswith(f"{ORIGIN_PREFIX}previous-"):
            out[name.removeprefix(ORIGIN_PREFIX)] = (value or b"").decode(errors="replace")
    return out


def record_doc(msg: Message) -> dict[str, Any]:
    """One dead-lettered record as a document (pure)."""
    key, value = msg.key(), msg.value()
    return {
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp_ms": msg.timestamp()[1],
        "origin": origin_of(msg.headers()),  # type: ignore[arg-type]
        "key": key.decode(errors="replace") if isinstance(key, bytes) else key,
        "value_bytes": len(value) if value is not None else None,
        "value": value.decode(errors="replace")[:200] if isinstance(value, bytes) else value,
    }


def _text(data: str | bytes | None) -> str | None:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _topic(template: str, group: str) -> str:
    return template.replace("{group}", group)


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _reader(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ds-dsctl-dlq",  # never commits: assign() only
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )


def watermarks(reader: Consumer, admin: AdminClient, topic: str) -> dict[int, tuple[int, int]]:
    """Low and high watermark of each partition of ``topic``; KeyError: no such topic."""
    metadata = admin.list_topics(topic, timeout=10)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        raise KeyError(topic)
    return {
        p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        for p in sorted(described.partitions)
    }


def read(
    reader: Consumer, topic: str, wanted: list[Range], timeout: float = 30.0
) -> Iterator[Message]:
    """The records of each range, in offset order per partition."""
    for r in wanted:
        reader.assign([TopicPartition(topic, r.partition, r.lo)])
        deadline = time.monotonic() + timeout
        done = False
        while not done and time.monotonic() < deadline:
            for msg in reader.consume(500, 0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                offset = msg.offset() or 0
                if offset >= r.hi:
                    done = True
                    break
                yield msg
                if offset == r.hi - 1:
                    done = True
                    break
        reader.unassign()


def _open(bootstrap: str, template: str, group: str) -> tuple[str, Consumer, AdminClient]:
    topic = _topic(template, group)
    return topic, _reader(bootstrap), _admin(bootstrap)


def _no_topic(topic: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] dead-letter topic {topic!r} does not exist")
    return typer.Exit(int(ExitCode.NOT_FOUND))


@dlq_app.command("list")
def list_(
    group: GroupArg,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    topic_template: TopicOption = DEFAULT_TEMPLATE,
    output: OutputOption = Output.table,
) -> None:
    """Per partition of the group's dead-letter topic: records kept (depth), offsets, and
    the age of the oldest record."""
    topic, reader, admin = _open(bootstrap, topic_template, group)
    try:
        marks = watermarks(reader, admin, topic)
        now_ms = int(time.time() * 1000)
        rows: list[dict[str, Any]] = []
        for p, (low, high) in sorted(marks.items()):
            oldest = list(
                read(reader, topic, ranges({p: (low, min(high, low + 1))}, p, None, None))
            )
            age = (now_ms - oldest[0].timestamp()[1]) / 1000 if oldest else None
            rows.append(
                {
                    "partition": p,
                    "low": low,
                    "high": high,
                    "depth": max(0, high - low),
                    "oldest_age_seconds": age,
                }
            )
    except KeyError:
        raise _no_topic(topic) from None
    finally:
        reader.close()
    doc: dict[str, Any] = {
        "group": group,
        "topic": topic,
        "depth": sum(r["depth"] for r in rows),
        "partitions": rows,
    }
    if output is Output.json:
        print(json.dumps(doc))
        return
    table = Table(title=f"{topic}: {doc['depth']} records")
    for column in ("partition", "low", "high", "depth", "oldest age"):
        table.add_column(column, justify="right")
    for row in rows:
        age = row["oldest_age_seconds"]
        table.add_row(
            str(row["partition"]), str(row["low"]), str(row["high"]), str(row["depth"]),
            "-" if age is None else str(datetime.timedelta(seconds=int(age))),
        )  # fmt: skip
    console.print(table)


@dlq_app.command("show")
def show(
    group: GroupArg,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    topic_template: TopicOption = DEFAULT_TEMPLATE,
    partition: PartitionOption = None,
    from_offset: FromOption = None,
    to_offset: ToOption = None,
    limit: Annotated[int, typer.Option(help="At most this many records.")] = 100,
    output: OutputOption = Output.table,
) -> None:
    """The records of the dead-letter topic with their origin (topic, partition, offset,
    deliveries, last error, client)."""
    topic, reader, admin = _open(bootstrap, topic_template, group)
    try:
        wanted = ranges(watermarks(reader, admin, topic), partition, from_offset, to_offset)
        docs = []
        for msg in read(reader, topic, wanted):
            docs.append(record_doc(msg))
            if len(docs) >= limit:
                break
    except KeyError:
        raise _no_topic(topic) from None
    finally:
        reader.close()
    if output is Output.json:
        for d in docs:
            print(json.dumps(d))
        return
    table = Table(title=topic)
    for column in ("p", "offset", "origin", "deliveries", "last error", "client", "key", "value"):
        table.add_column(column)
    for d in docs:
        o = d["origin"]
        table.add_row(
            str(d["partition"]), str(d["offset"]),
            f"{o.get('topic')}[{o.get('partition')}]@{o.get('offset')}",
            o.get("deliveries", ""), o.get("last-error", ""), o.get("client", ""),
            str(d["key"]), str(d["value"])[:40],
        )  # fmt: skip
    console.print(table)


@dlq_app.command("replay")
def replay(
    group: GroupArg,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    topic_template: TopicOption = DEFAULT_TEMPLATE,
    partition: PartitionOption = None,
    from_offset: FromOption = None,
    to_offset: ToOption = None,
    to_topic: Annotated[
        str | None,
        typer.Option(help="Produce here instead of each record's origin topic (its group's)."),
    ] = None,
    origin_offset: Annotated[
        int | None, typer.Option(help="Only the record that had this offset at its origin.")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Only records with this key.")] = None,
    client: Annotated[
        str | None, typer.Option(help="Only records given up by this client (ds-dlq-client).")
    ] = None,
    since: SinceOption = None,
    until: UntilOption = None,
    dry_run: Annotated[bool, typer.Option(help="Count what would be replayed.")] = False,
) -> None:
    """Produce dead-lettered records again: to their origin topic (the group's clients
    receive them through the mesh, as new records at new offsets) or to --to-topic. Each
    record is acked by Kafka before the command ends (idempotent producer); the count is
    printed. Purge separately, after checking."""
    now = datetime.datetime.now(datetime.UTC)
    since_ms = when_ms(since, now) if since is not None else None
    until_ms = when_ms(until, now) if until is not None else None
    topic, reader, admin = _open(bootstrap, topic_template, group)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[str] = []
    sent = 0
    try:
        marks = watermarks(reader, admin, topic)
        if since_ms is not None:
            asked = [TopicPartition(topic, p, since_ms) for p in marks]
            found = {tp.partition: tp.offset for tp in reader.offsets_for_times(asked, 10)}
            marks = from_times(marks, found)
        wanted = ranges(marks, partition, from_offset, to_offset)
        for msg in read(reader, topic, wanted):
            origin = origin_of(msg.headers())  # type: ignore[arg-type]
            if origin_offset is not None and origin.get("offset") != str(origin_offset):
                continue
            msg_key = msg.key()
            if key is not None and _text(msg_key) != key:
                continue
            if client is not None and origin.get("client") != client:
                continue
            at = msg.timestamp()[1]
            if (since_ms is not None and at < since_ms) or (
                until_ms is not None and at >= until_ms
            ):
                continue
            target = to_topic or origin.get("topic")
            if not target:
                errors.append(f"offset {msg.offset()}: no origin topic header")
                continue
            sent += 1
            if dry_run:
                continue
            producer.produce(
                target,
                key=msg_key,
                value=msg.value(),
                headers=msg.headers(),
                on_delivery=lambda err, _m: errors.append(err.str()) if err else None,
            )
            producer.poll(0)
        left = producer.flush(30)
    except KeyError:
        raise _no_topic(topic) from None
    finally:
        reader.close()
    verb = "would replay" if dry_run else "replayed"
    doc = {"group": group, "topic": topic, verb.replace(" ", "_"): sent, "errors": errors[:10]}
    print(json.dumps(doc))
    if errors or left:
        raise typer.Exit(int(ExitCode.INCOMPLETE))


@dlq_app.command("purge")
def purge(
    group: GroupArg,
    to_offset: Annotated[
        int, typer.Option("--to-offset", help="Delete records below this offset.")
    ],
    partition: Annotated[int, typer.Option("--partition", help="The dead-letter partition.")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    topic_template: TopicOption = DEFAULT_TEMPLATE,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
) -> None:
    """Delete the records of a dead-letter partition below --to-offset (Kafka
    DeleteRecords; the low watermark moves there). For records replayed and checked."""
    topic = _topic(topic_template, group)
    if not yes:
        typer.confirm(f"delete {topic}[{partition}] below offset {to_offset}?", abort=True)
    admin = _admin(bootstrap)
    futures = admin.delete_records([TopicPartition(topic, partition, to_offset)])
    for tp, future in futures.items():
        error = future.exception(timeout=30)
        if error is not None:
            err_console.print(f"[red]error:[/red] {tp.topic}[{tp.partition}]: {error}")
            raise typer.Exit(int(ExitCode.ERROR))
        low = future.result().low_watermark
        print(json.dumps({"group": group, "topic": topic, "partition": partition, "low": low}))


def register(app: typer.Typer) -> None:
    """Adds ``dsctl dlq`` to the app."""
    app.add_typer(dlq_app, name="dlq")
