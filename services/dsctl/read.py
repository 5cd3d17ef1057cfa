"""dsctl's read commands: groups, describe, lag, bindings, clients, faults, top (ARCHITECTURE §5.5).

Each command fetches with :mod:`services.dsctl.admin_client`, builds one document with
:mod:`services.dsctl.render`, and prints it as JSON on stdout (``--output json``) or as Rich
tables. Diagnostics, spinners and errors go to stderr only, so JSON output can be piped.
Refreshing commands (``lag --watch``, ``top``, ``faults --follow``) print one JSON document
per line in JSON mode, and redraw in place (Rich Live) in table mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import inspect
import json
import sys
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from dataservice.assigner.v1 import admin_pb2
from dataservice.common.v1 import common_pb2
from services.dsctl import clients_view, render
from services.dsctl.admin_client import (
    DEFAULT_ASSIGNER,
    DEFAULT_NOTIFIER,
    DEFAULT_TIMEOUT_SECONDS,
    EXIT_CODES_HELP,
    AssignerClient,
    CliError,
    ExitCode,
    FaultFilter,
    NotifierClient,
)
from services.runtime.faults import parse_type

console = Console()
err_console = Console(stderr=True)

P = ParamSpec("P")
T = TypeVar("T")


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table (for people) or json (for scripts).")
]
AssignerOption = Annotated[
    str, typer.Option("--assigner", envvar="DS_ASSIGNER", help="Assigner gRPC HOST:PORT.")
]
NotifierOption = Annotated[
    str, typer.Option("--notifier", envvar="DS_NOTIFIER", help="Notifier gRPC HOST:PORT.")
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each call.")
]
IntervalOption = Annotated[
    float, typer.Option("--interval", "-i", min=0.2, help="Seconds between refreshes.")
]
CountOption = Annotated[
    int | None, typer.Option("--count", "-n", min=1, help="Stop after N refreshes.")
]


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def print_json(doc: Any, *, one_line: bool = False) -> None:
    """A document on stdout: indented, or compact on one line for streams (NDJSON)."""
    text = json.dumps(doc, separators=(",", ":")) if one_line else json.dumps(doc, indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def waiting(output: Output, what: str) -> Iterator[None]:
    """A spinner on stderr while waiting on the network, in table mode only."""
    if output is Output.table:
        with err_console.status(what):
            yield
    else:
        yield


def reports_errors(command: Callable[P, T]) -> Callable[P, T]:
    """Ends a command with its :class:`CliError`'s message and exit code, no traceback;
    Ctrl-C ends a refreshing command normally."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return command(*args, **kwargs)
        except CliError as err:
            err_console.print(f"[red]error:[/red] {err.message}", highlight=False, soft_wrap=True)
            raise typer.Exit(int(err.exit_code)) from None
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.OK)) from None

    return wrapper


def refresh(
    fetch: Callable[[], render.Doc],
    view: Callable[[render.Doc], RenderableType],
    *,
    output: Output,
    interval: float,
    count: int | None,
    first_wait: bool = False,
) -> render.Doc | None:
    """Fetch and show ``count`` times (forever when None) every ``interval`` seconds.

    A failure before the first document ends the command; later, an unreachable service is
    reported on stderr and retried at the next tick, so a watch survives a failover.
    Returns the last document shown.
    """
    shown = 0
    last: render.Doc | None = None
    next_tick = time.monotonic() + (interval if first_wait else 0.0)
    live = Live(console=console, auto_refresh=False) if output is Output.table else None
    with live if live is not None else contextlib.nullcontext():
        while count is None or shown < count:
            time.sleep(max(0.0, next_tick - time.monotonic()))
            next_tick += interval
            try:
                doc = fetch()
            except CliError as err:
                if last is None or err.exit_code is not ExitCode.UNAVAILABLE:
                    raise
                err_console.print(
                    f"[yellow]warning:[/yellow] {err.message}", highlight=False, soft_wrap=True
                )
                continue
            doc = {"time": now_iso(), **doc}
            if live is not None:
                live.update(view(doc), refresh=True)
            else:
                print_json(doc, one_line=True)
            last = doc
            shown += 1
    return last


def register(app: typer.Typer) -> None:
    """Adds the read commands to the ``dsctl`` app."""
    for name, command in (
        ("groups", groups),
        ("describe", describe),
        ("lag", lag),
        ("bindings", bindings),
        ("clients", clients),
        ("faults", faults),
        ("top", top),
    ):
        app.command(name, help=reflowed(command.__doc__), epilog=EXIT_CODES_HELP)(
            reports_errors(command)
        )


def reflowed(doc: str | None) -> str:
    """A docstring as help text: paragraphs kept, source line breaks dropped (Typer's rich
    help would print them as they are)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def groups(
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Every group: mode, topics, members, partitions and total lag."""
    with AssignerClient(assigner, timeout) as client, waiting(output, f"asking {assigner}"):
        doc = render.groups_doc(client.list_groups())
    if output is Output.json:
        print_json(doc)
    else:
        console.print(render.groups_table(doc))


def describe(
    group: Annotated[str, typer.Argument(help="Group name.")],
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """One group: config, members, leases, offsets and lag, bindings.

    Leases show holder, epoch, state and expiry deadline; partitions their committed and
    end offsets and lag in records and seconds.
    """
    with AssignerClient(assigner, timeout) as client, waiting(output, f"asking {assigner}"):
        doc = render.describe_doc(client.describe(group))
    if output is Output.json:
        print_json(doc)
    else:
        console.print(render.describe_view(doc))


def lag(
    group: Annotated[str | None, typer.Argument(help="Group name; all groups if omitted.")] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh until Ctrl-C (or --count).")
    ] = False,
    interval: IntervalOption = 2.0,
    count: CountOption = None,
    max_lag: Annotated[
        int | None,
        typer.Option(
            "--max-lag",
            min=0,
            help="Exit 4 when a group's total lag (records) is above this (with --watch: in "
            "the last refresh).",
        ),
    ] = None,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Lag per partition: committed, end, lag in records and seconds.

    Offsets are Kafka's (the group's committed offsets, the partitions' high watermarks);
    lag in seconds is the age of the oldest unconsumed record. All groups when GROUP is
    omitted. --watch redraws every --interval seconds (JSON: one document per line).
    """
    with AssignerClient(assigner, timeout) as client:

        def fetch() -> render.Doc:
            return render.lag_doc(client.describe_groups(group))

        if watch or count is not None:
            doc = refresh(fetch, render.lag_table, output=output, interval=interval, count=count)
        else:
            with waiting(output, f"asking {assigner}"):
                doc = {"time": now_iso(), **fetch()}
            if output is Output.json:
                print_json(doc)
            else:
                console.print(render.lag_table(doc))
    if max_lag is not None and doc is not None and (over := render.lag_over(doc, max_lag)):
        err_console.print(f"lag above {max_lag:,} records in: {', '.join(over)}", highlight=False)
        raise typer.Exit(int(ExitCode.THRESHOLD))


def bindings(
    group: Annotated[str | None, typer.Argument(help="Group name; all groups if omitted.")] = None,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Client bindings: client_id → the sidecar endpoints serving it."""
    with AssignerClient(assigner, timeout) as client, waiting(output, f"asking {assigner}"):
        doc = render.bindings_doc(client.describe_groups(group))
    if output is Output.json:
        print_json(doc)
    else:
        console.print(render.bindings_table(doc["bindings"]))


def clients(
    group: Annotated[str | None, typer.Argument(help="Group name; all groups if omitted.")] = None,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Application clients: per client id its group, the sidecars it reads from, records/s,
    acks/s and errors/s there, when it was last seen and since when it is bound.

    Rates are over the sidecars' last heartbeats (about 10 s). A client bound but not
    reading yet, and one reading from a sidecar without a binding, are both listed.
    """
    with AssignerClient(assigner, timeout) as client, waiting(output, f"asking {assigner}"):
        doc = clients_view.clients_doc(client.list_clients(group))
    if output is Output.json:
        print_json(doc)
    else:
        console.print(clients_view.clients_table(doc))


def faults(
    group: Annotated[str, typer.Option("--group", "-g", help="Only this group's faults.")] = "",
    fault_type: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="Only these fault types, e.g. LAG_ERROR (repeat)."),
    ] = None,
    open_only: Annotated[
        bool, typer.Option("--open", help="Only faults not resolved yet.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-l", min=0, max=10_000, help="At most N stored faults.")
    ] = 50,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Then stream new faults as they are published."),
    ] = False,
    count: Annotated[
        int | None,
        typer.Option("--count", "-n", min=1, help="With --follow: stop after N new faults."),
    ] = None,
    output: OutputOption = Output.table,
    notifier: NotifierOption = DEFAULT_NOTIFIER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Fault events from the notifier (newest first), or follow new ones.

    With --follow: the last --limit events oldest first, then every new one as it is
    published (JSON: one event per line), until Ctrl-C or --count new events.
    """
    try:
        types = tuple(parse_type(t) for t in fault_type or [])
    except ValueError as exc:
        raise CliError(str(exc), ExitCode.ERROR) from None
    which = FaultFilter(group=group, types=types, open_only=open_only)
    with NotifierClient(notifier, timeout) as client:
        if not follow:
            with waiting(output, f"asking {notifier}"):
                doc = render.faults_doc(client.list_faults(which, limit))
            if output is Output.json:
                print_json(doc)
            else:
                console.print(render.faults_table(doc["faults"]))
            return
        _follow(client, which, limit, count, output)


def _follow(
    client: NotifierClient, which: FaultFilter, limit: int, count: int | None, output: Output
) -> None:
    # Watch first, then list: nothing published in between is missed; the overlap is
    # removed by event id.
    stream = client.watch_faults(which)
    backlog = list(reversed(client.list_faults(which, limit))) if limit else []
    seen: set[str] = set()

    def show(event: common_pb2.FaultEvent) -> None:
        seen.add(event.id)
        doc = render.fault_doc(event)
        if output is Output.json:
            print_json(doc, one_line=True)
        else:
            console.print(*render.fault_row(doc), sep="  ", highlight=False)

    for event in backlog:
        show(event)
    if output is Output.table:
        err_console.print(f"[dim]following {client.endpoint} (Ctrl-C to stop)[/dim]")
    new = 0
    for event in stream:
        if event.id in seen:
            continue
        show(event)
        new += 1
        if count is not None and new >= count:
            return


def top(
    interval: IntervalOption = 2.0,
    count: CountOption = None,
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="Only this group; default all.")
    ] = None,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Live distribution: partitions and records/s per sidecar, imbalance per group.

    Records/s are committed offsets advanced per interval, credited to each partition's
    holder; imbalance is max/mean partitions per member. The first refresh comes after one
    interval, so it has rates (JSON: one document per line).
    """
    with AssignerClient(assigner, timeout) as client:
        with waiting(output, f"asking {assigner}"):
            previous = _Sample.take(client, group)

        def fetch() -> render.Doc:
            nonlocal previous
            current = _Sample.take(client, group)
            consumed = render.consumed_since(previous.offsets, current.offsets)
            doc = render.top_doc(current.described, consumed, current.at - previous.at)
            previous = current
            return doc

        refresh(
            fetch, render.top_table, output=output, interval=interval, count=count,
            first_wait=True,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Sample:
    """The groups as described at one instant, with their committed offsets."""

    at: float  # monotonic seconds
    described: list[admin_pb2.DescribeGroupResponse]
    offsets: dict[render.PartitionKey, int]

    @classmethod
    def take(cls, client: AssignerClient, group: str | None) -> _Sample:
        described = client.describe_groups(group)
        return cls(time.monotonic(), described, render.committed_offsets(described))
