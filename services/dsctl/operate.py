"""dsctl's operations on a running group (ARCHITECTURE §5.5): ``offsets reset``, ``move``,
``drain``, ``undrain`` and ``mode``.

Each is one AdminService change with a fresh ``request_id`` (a retry inside the call is
applied once) and the caller's ``user@host`` as its actor (the audit record). Changes that
lose data or move every partition (a reset with ``--execute``, a drain, a mode switch) ask
for confirmation on the terminal unless ``--yes``; nothing changes when not confirmed
(exit 1). Commands that start a handoff wait for it and show its progress (``--wait``;
exit 5 when it is not done by then: it goes on). Documents and tables are built in
:mod:`services.dsctl.operate_render`; JSON goes to stdout alone.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated

import click
import typer
from google.protobuf import field_mask_pb2
from rich.live import Live

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.dsctl import operate_render as view
from services.dsctl import render
from services.dsctl.admin_client import (
    DEFAULT_ASSIGNER,
    DEFAULT_TIMEOUT_SECONDS,
    EXIT_CODES_HELP,
    AssignerClient,
    CliError,
    ExitCode,
)
from services.dsctl.read import (
    AssignerOption,
    Output,
    OutputOption,
    TimeoutOption,
    console,
    err_console,
    print_json,
    reflowed,
    reports_errors,
    waiting,
)
from services.dsctl.reset_flags import STRATEGY_NAMES, ResetFlags, reset_request, strategy_of
from services.runtime.group_enums import EXTERNAL_CHANGE_BY_NAME, MODE_BY_NAME

POLL_SECONDS = 0.25
# A mode switch waits for every lease to be handed off (drain + lease expiry at worst) and,
# to leased, for Kafka's group to empty: more than a read's 15 s.
MODE_TIMEOUT_SECONDS = 120.0

YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (scripts).")
]
WaitOption = Annotated[
    float,
    typer.Option("--wait", min=0.0, help="Seconds to wait for the handoffs (0 = do not wait)."),
]
GroupOption = Annotated[
    str | None,
    typer.Option("--group", "-g", help="The sidecar's group; default every group it serves."),
]

offsets_app = typer.Typer(help="Reset a group's committed offsets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Adds the operations to the ``dsctl`` app."""
    for name, command in (("move", move), ("drain", drain), ("undrain", undrain), ("mode", mode)):
        app.command(name, help=reflowed(command.__doc__), epilog=EXIT_CODES_HELP)(
            reports_errors(command)
        )
    offsets_app.command("reset", help=reflowed(offsets_reset.__doc__), epilog=EXIT_CODES_HELP)(
        reports_errors(offsets_reset)
    )
    offsets_app.command(
        "external", help=reflowed(offsets_external.__doc__), epilog=EXIT_CODES_HELP
    )(reports_errors(offsets_external))
    app.add_typer(offsets_app, name="offsets")


def confirm(question: str, yes: bool) -> None:
    """Go on only if confirmed on the terminal (or ``--yes``); else exit 1, nothing done."""
    if yes:
        return
    try:
        agreed = typer.confirm(question, default=False, err=True)
    except (typer.Abort, click.exceptions.Abort):  # end of input: nobody to confirm
        agreed = False
    if not agreed:
        err_console.print()  # the answer typed (or not) ended no line of its own
        raise CliError("not confirmed: nothing changed (pass --yes to skip the question)")


def emit(output: Output, doc: view.Doc, table: Callable[[view.Doc], object]) -> None:
    if output is Output.json:
        print_json(doc)
    else:
        console.print(table(doc))


# ---- offsets reset -----------------------------------------------------------------------


def offsets_reset(
    group: Annotated[str, typer.Argument(help="Group name.")],
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="To each partition's log start.")
    ] = False,
    to_latest: Annotated[
        bool, typer.Option("--to-latest", help="To each partition's end (skip the backlog).")
    ] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            help="To the first record at or after this time, ISO 8601 "
            "(2026-01-31T12:00:00.000, local time; or with Z / +01:00).",
        ),
    ] = None,
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", help="To this offset (clamped into the log).")
    ] = None,
    shift_by: Annotated[
        int | None,
        typer.Option("--shift-by", help="By N records from the committed offset (-N rewinds)."),
    ] = None,
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic", help="TOPIC or TOPIC:P,P,... (repeat); default every topic of the group."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only show the new offsets (the default).")
    ] = False,
    execute: Annotated[bool, typer.Option("--execute", help="Commit the new offsets.")] = False,
    yes: YesOption = False,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Reset GROUP's committed offsets, with kafka-consumer-groups' flags.

    Without --execute (or with --dry-run) it shows the offsets a reset would commit and
    changes nothing. With --execute, after confirmation: a leased group's partitions are
    paused on their sidecars, committed at the new offsets under new lease epochs and
    resumed there — bound clients read the new position on their next fetch, acks from
    before are refused; a kafka_group group must have no members. Targets outside the log
    are clamped (shown as a note).
    """
    if dry_run and execute:
        raise CliError("--dry-run and --execute exclude each other")
    flags = ResetFlags(to_earliest, to_latest, to_datetime, to_offset, shift_by, topic or ())
    strategy = STRATEGY_NAMES[strategy_of(flags)[0]]
    with AssignerClient(assigner, timeout) as client:
        if execute and not yes:
            with waiting(output, f"asking {assigner}"):
                preview = client.reset_offsets(reset_request(group, flags, dry_run=True))
            err_console.print(view.reset_table(view.reset_doc(group, strategy, preview)))
            confirm(
                f"Commit these offsets for {len(preview.partitions)} partition(s) of {group}?",
                yes,
            )
        request = reset_request(group, flags, dry_run=not execute, request_id=str(uuid.uuid4()))
        with waiting(output, f"resetting on {assigner}" if execute else f"asking {assigner}"):
            response = client.reset_offsets(request)
    emit(output, view.reset_doc(group, strategy, response), view.reset_table)


# ---- move --------------------------------------------------------------------------------


def move(
    group: Annotated[str, typer.Argument(help="Group name.")],
    partition: Annotated[str, typer.Argument(help="TOPIC:PARTITION to move.")],
    sidecar: Annotated[str, typer.Argument(help="Sidecar id to move it to.")],
    wait: WaitOption = 30.0,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Move one partition's lease to SIDECAR with a cooperative handoff.

    The holder stops delivering it, waits for in-flight acks, commits and releases; the
    target then gets it under a new epoch at the committed offset. Waits until the target
    holds it (--wait).
    """
    topic, _, number = partition.rpartition(":")
    if not topic or not (number.isascii() and number.isdigit()):
        raise CliError(f"PARTITION {partition!r}: expected TOPIC:PARTITION, e.g. orders:3")
    tp = (topic, int(number))
    started = time.monotonic()
    with AssignerClient(assigner, timeout) as client:
        before = _lease(client.describe(group), tp)
        client.move_lease(
            admin_pb2.MoveLeaseRequest(
                group=group,
                topic=topic,
                partition=tp[1],
                target_sidecar_id=sidecar,
                request_id=str(uuid.uuid4()),
            )
        )

        def moved(described: admin_pb2.DescribeGroupResponse) -> bool:
            now = _lease(described, tp)
            return bool(now["holder"] == sidecar and now["state"] == "granted")

        described, done = _wait_for(client, group, moved, wait, output, f"moving {partition}")
    doc = view.move_doc(
        group, topic, tp[1], before=before, after=_lease(described, tp),
        seconds=time.monotonic() - started, done=done,
    )  # fmt: skip
    emit(output, doc, view.move_table)
    if not done:
        raise typer.Exit(int(ExitCode.INCOMPLETE))


def _lease(described: admin_pb2.DescribeGroupResponse, tp: tuple[str, int]) -> view.Doc:
    for lease in described.leases:
        if (lease.topic, lease.partition) == tp:
            return render.lease_doc(lease)
    raise CliError(
        f"{tp[0]}:{tp[1]} is not a partition of group {described.config.name!r}",
        ExitCode.NOT_FOUND,
    )


# ---- drain / undrain ---------------------------------------------------------------------


def drain(
    sidecar: Annotated[str, typer.Argument(help="Sidecar id to drain.")],
    group: GroupOption = None,
    wait: WaitOption = 60.0,
    yes: YesOption = False,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Move every lease off SIDECAR for maintenance; it stays connected (capacity 0).

    Each partition is handed off cooperatively (revoke, drain in-flight acks, commit,
    grant to another sidecar), with the progress shown until none is left (--wait). The
    drain is kept across assigner restarts until `dsctl undrain`.
    """
    _drain_or_undrain(sidecar, group, wait, yes, output, assigner, timeout, drained=True)


def undrain(
    sidecar: Annotated[str, typer.Argument(help="Sidecar id to undrain.")],
    group: GroupOption = None,
    wait: WaitOption = 30.0,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """End SIDECAR's drain: the group is rebalanced and it gets its share back.

    Waits until every partition is held again and SIDECAR holds its share (--wait).
    """
    _drain_or_undrain(sidecar, group, wait, True, output, assigner, timeout, drained=False)


def _drain_or_undrain(
    sidecar: str, group: str | None, wait: float, yes: bool, output: Output, assigner: str,
    timeout: float, *, drained: bool,
) -> None:  # fmt: skip
    done_all = True
    with AssignerClient(assigner, timeout) as client:
        groups = [group] if group else _groups_of(client, sidecar, drained=drained)
        if drained:
            confirm(f"Move every partition off {sidecar} in {', '.join(groups)}?", yes)
        for name in groups:
            doc = _drain_group(client, name, sidecar, wait, output, drained=drained)
            emit(output, doc, view.drain_table)
            done_all = done_all and doc["done"]
    if not done_all:
        raise typer.Exit(int(ExitCode.INCOMPLETE))


def _drain_group(
    client: AssignerClient, group: str, sidecar: str, wait: float, output: Output, *,
    drained: bool,
) -> view.Doc:  # fmt: skip
    started = time.monotonic()
    before = client.describe(group)
    held = view.leases_of(before, sidecar)
    if drained:
        client.drain(
            admin_pb2.DrainSidecarRequest(
                group=group, sidecar_id=sidecar, request_id=str(uuid.uuid4())
            )
        )
    else:
        client.undrain(
            admin_pb2.UndrainSidecarRequest(
                group=group, sidecar_id=sidecar, request_id=str(uuid.uuid4())
            )
        )

    def finished(described: admin_pb2.DescribeGroupResponse) -> bool:
        mine = view.leases_of(described, sidecar)
        if drained:
            return not mine and view.settled(described)
        share = len(described.leases) // max(len(described.members), 1)
        return view.settled(described) and len(mine) >= share

    def doc_of(described: admin_pb2.DescribeGroupResponse, done: bool) -> view.Doc:
        if drained:  # where each of its partitions went
            moved = view.moves(held, described)
        else:  # where each partition it holds now came from
            now = {(le["topic"], le["partition"]) for le in view.leases_of(described, sidecar)}
            came = [render.lease_doc(le) for le in before.leases if (le.topic, le.partition) in now]
            moved = view.moves(came, described)
        return view.drain_doc(
            group, sidecar, drained=drained, moved=moved, held=view.leases_of(described, sidecar),
            seconds=time.monotonic() - started, done=done,
        )  # fmt: skip

    verb = "draining" if drained else "undraining"
    described, done = _wait_for(
        client, group, finished, wait, output, f"{verb} {sidecar}",
        progress=lambda d: view.progress_line(doc_of(d, False)),
    )  # fmt: skip
    return doc_of(described, done)


def _groups_of(client: AssignerClient, sidecar: str, *, drained: bool) -> list[str]:
    """The groups ``sidecar`` is a member of (NOT_FOUND when none)."""
    names = [
        d.config.name
        for d in client.describe_groups(None)
        if any(m.sidecar_id == sidecar for m in d.members)
    ]
    if not names:
        raise CliError(
            f"sidecar {sidecar!r} is not a live member of any group (name one with --group"
            f"{' to undrain it' if not drained else ''})",
            ExitCode.NOT_FOUND,
        )
    return names


# ---- mode --------------------------------------------------------------------------------


def mode(
    group: Annotated[str, typer.Argument(help="Group name.")],
    new_mode: Annotated[str, typer.Argument(metavar="MODE", help="leased or kafka_group.")],
    yes: YesOption = False,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the switch.")
    ] = MODE_TIMEOUT_SECONDS,
) -> None:
    """Switch GROUP between leased and kafka_group, with its sidecars and clients running.

    Committed offsets are kept; every partition is handed off once (in-flight acks
    drained, acked offsets committed), so only records delivered and not acked then are
    delivered again. Returns once the switch is complete.
    """
    if new_mode not in MODE_BY_NAME:
        raise CliError(f"MODE {new_mode!r}: expected leased or kafka_group")
    started = time.monotonic()
    with AssignerClient(assigner, timeout) as client:
        config = client.describe(group).config
        before = str(render.config_doc(config)["mode"])
        if before == new_mode:
            err_console.print(f"group {group} is already in {new_mode} mode")
            return
        confirm(
            f"Switch {group} from {before} to {new_mode}? Every partition is handed off once.",
            yes,
        )
        request = admin_pb2.UpdateGroupRequest(
            group=types_pb2.GroupConfig(name=group, mode=MODE_BY_NAME[new_mode]),
            update_mask=field_mask_pb2.FieldMask(paths=["mode"]),
            expected_config_version=config.config_version,
            request_id=str(uuid.uuid4()),
        )
        with waiting(output, f"switching {group} to {new_mode}"):
            response = client.update_group(request)
    emit(
        output, view.mode_doc(group, before, response, time.monotonic() - started), view.mode_table
    )


# ---- external offset changes ------------------------------------------------------------


def offsets_external(
    group: Annotated[str, typer.Argument(help="Group name.")],
    new_mode: Annotated[str, typer.Argument(metavar="MODE", help="follow, revert or ignore.")],
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """What GROUP's sidecars do about a committed offset the mesh did not write, such as
    `kafka-consumer-groups --reset-offsets` (leased mode; applies live).

    follow (the default): apply it like `dsctl offsets reset`; revert: commit the mesh's
    position over it at once and record OFFSETS_RESET with action reverted; ignore: do not
    look (no OffsetFetch around commits), the next commits overwrite it.
    """
    if new_mode not in EXTERNAL_CHANGE_BY_NAME:
        raise CliError(f"MODE {new_mode!r}: expected follow, revert or ignore")
    with AssignerClient(assigner, timeout) as client:
        config = client.describe(group).config
        before = str(render.config_doc(config)["external_offset_changes"])
        request = admin_pb2.UpdateGroupRequest(
            group=types_pb2.GroupConfig(
                name=group, external_offset_changes=EXTERNAL_CHANGE_BY_NAME[new_mode]
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["external_offset_changes"]),
            expected_config_version=config.config_version,
            request_id=str(uuid.uuid4()),
        )
        response = client.update_group(request)
    now = render.config_doc(response.group)
    doc = {
        "group": group,
        "external_offset_changes_before": before,
        "external_offset_changes": now["external_offset_changes"],
        "config_version": now["config_version"],
    }
    emit(output, doc, view.external_table)


# ---- waiting for handoffs ----------------------------------------------------------------


def _wait_for(
    client: AssignerClient,
    group: str,
    done: Callable[[admin_pb2.DescribeGroupResponse], bool],
    wait: float,
    output: Output,
    what: str,
    progress: Callable[[admin_pb2.DescribeGroupResponse], object] | None = None,
) -> tuple[admin_pb2.DescribeGroupResponse, bool]:
    """DescribeGroup every POLL_SECONDS until ``done`` or ``wait`` seconds passed; the last
    description and whether it was done. Progress on stderr in table mode."""
    deadline = time.monotonic() + wait
    with _live(output) as show:
        while True:
            described = client.describe(group)
            if done(described):
                return described, True
            if time.monotonic() >= deadline:
                return described, False
            show(progress(described) if progress is not None else f"{what}…")
            time.sleep(POLL_SECONDS)


@contextlib.contextmanager
def _live(output: Output) -> Iterator[Callable[[object], None]]:
    if output is Output.json:
        yield lambda _renderable: None
        return
    with Live(console=err_console, auto_refresh=False, transient=True) as live:
        yield lambda renderable: live.update(renderable, refresh=True)  # type: ignore[arg-type]
