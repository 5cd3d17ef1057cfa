"""``dsctl config get|set``: a group's consumer config, shown and changed live (ARCHITECTURE
§5.5).

``set`` reads the group (``DescribeGroup``), builds the next config from ``KEY=VALUE``
arguments and ``--unset`` keys, checks it against the allow-list here (the assigner checks it
again, with librdkafka), shows the diff, asks before a change that replaces the sidecars'
consumers (unless ``--yes``), writes it with ``UpdateGroup`` (field mask: ``consumer_config``
and the group settings that change; ``expected_config_version`` = the version read, a fresh
``request_id``), then waits until every member reports running the new version or refusing
it (``--wait``). Exit 0 when every member applied it, 5 when it was stored but some member
refused it or did not report in time (each named), 1 for a refused or malformed change
(nothing stored).

Beside librdkafka properties, ``KEY=VALUE`` and ``--unset`` take the group settings of
:mod:`.group_settings` (``ordering``, ``commit_fencing``): one ``UpdateGroup``, one version,
whatever the mix.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Annotated

import typer
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.dsctl import config_view, group_settings
from services.dsctl.admin_client import (
    DEFAULT_ASSIGNER,
    DEFAULT_TIMEOUT_SECONDS,
    EXIT_CODES_HELP,
    AssignerClient,
    CliError,
    ExitCode,
)
from services.dsctl.group_settings import SettingsChange
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
from services.dsctl.render import MODES
from services.runtime.consumer_config import (
    ConfigChange,
    ConsumerConfigError,
    check_allowed,
    plan,
)

WAIT_POLL_SECONDS = 0.2

config_app = typer.Typer(
    help="A group's consumer config (librdkafka properties): show it, change it live.",
    no_args_is_help=True,
)


def get(
    group: Annotated[str, typer.Argument(help="Group name.")],
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """The group's consumer config and its version, and the version each member runs
    (applied, refused with the reason, or pending)."""
    with AssignerClient(assigner, timeout) as client, waiting(output, f"asking {assigner}"):
        doc = config_view.get_doc(client.describe(group))
    if output is Output.json:
        print_json(doc)
    else:
        console.print(config_view.get_view(doc))


def set_(
    group: Annotated[str, typer.Argument(help="Group name.")],
    assignments: Annotated[
        list[str] | None,
        typer.Argument(
            help="Properties to set, KEY=VALUE: librdkafka names, or the group settings "
            "ordering (unordered|key|partition) and commit_fencing (lease|kafka).",
            show_default=False,
        ),
    ] = None,
    unset: Annotated[
        list[str] | None,
        typer.Option(
            "--unset",
            help="A property to remove (back to the sidecar's default), or commit_fencing "
            "(back to each sidecar's setting).",
        ),
    ] = None,
    yes: Annotated[
        bool,
        typer.Option("--yes", "-y", help="Do not ask before replacing the sidecars' consumers."),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", min=0, help="Seconds to wait for every member to apply it (0: do not wait)."
        ),
    ] = 10.0,
    output: OutputOption = Output.table,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Change the group's consumer config, or its ordering or commit_fencing, live: every
    sidecar applies it within seconds, without a restart and without a lease moving.

    Shows the diff and the new version, then waits until every member runs it, or says
    which member refused it (it keeps its old config) or did not report in time (exit 5).
    A change that needs new consumer instances asks first, unless --yes. Properties
    outside the allow-list, and a setting's unknown value, are refused, naming the key,
    and nothing changes (exit 1). Settings: ordering=unordered|key|partition and
    commit_fencing=lease|kafka (live only towards kafka: the assigner refuses the way back).
    """
    try:
        sets, unsets, setting_sets, setting_unsets = group_settings.split(
            config_view.parse_assignments(assignments or []), unset or []
        )
        group_settings.check(setting_sets, setting_unsets)
    except ValueError as exc:
        raise CliError(str(exc), ExitCode.ERROR) from None
    if not (sets or unsets or setting_sets or setting_unsets):
        raise CliError("name at least one KEY=VALUE or --unset KEY", ExitCode.ERROR)
    with AssignerClient(assigner, timeout) as client:
        with waiting(output, f"asking {assigner}"):
            before = client.describe(group).config
        try:
            desired = config_view.merged(before.consumer_config, sets, unsets)
            check_allowed(desired)
            settings = group_settings.changes(before, setting_sets, setting_unsets)
        except ConsumerConfigError as err:
            raise CliError(f"group.consumer_config: {err.message}", ExitCode.ERROR) from None
        except ValueError as exc:
            raise CliError(str(exc), ExitCode.ERROR) from None
        mode = MODES.get(before.mode, "unknown")
        change = plan(before.consumer_config, desired, kafka_group=mode == "kafka_group")
        if change.empty and not settings:
            err_console.print(f"nothing to change: {group} runs config v{before.config_version}")
            if output is Output.json:
                print_json(config_view.set_doc(before, before, change, []))
            return
        if output is Output.table or not yes:
            _show_plan(before, change, settings, mode)
        if change.new_consumer and not yes:
            _confirm(group)
        request = update_request(before, None if change.empty else desired, settings)
        after = client.update_group(request).group
        states = _wait_applied(client, group, after.config_version, wait, output)
    doc = config_view.set_doc(before, after, change, states, settings)
    if output is Output.json:
        print_json(doc)
    else:
        console.print(config_view.set_view(doc))
    if not doc["applied"]:
        raise CliError(_not_applied(doc, wait), ExitCode.NOT_APPLIED)


def _show_plan(
    before: types_pb2.GroupConfig, change: ConfigChange, settings: SettingsChange, mode: str
) -> None:
    err_console.print(
        f"{before.name} ({mode}): config v{before.config_version}, to change:",
        highlight=False,
    )
    for line in config_view.diff_lines(config_view.change_doc(change, settings)):
        err_console.print(line, highlight=False)
    for effect in config_view.effects(mode, change, settings):
        err_console.print(effect, style="dim", highlight=False, markup=False)


def _confirm(group: str) -> None:
    if not sys.stdin.isatty():
        raise CliError(
            "this change replaces the Kafka consumer of every sidecar of the group: confirm "
            "with --yes (no terminal to ask on)",
            ExitCode.ERROR,
        )
    if not typer.confirm(f"Apply to every sidecar of {group}?", default=False, err=True):
        raise CliError("not changed", ExitCode.ERROR)


def update_request(
    before: types_pb2.GroupConfig, desired: dict[str, str] | None, settings: SettingsChange
) -> admin_pb2.UpdateGroupRequest:
    """The UpdateGroup of a change: the consumer config ``desired`` (None: unchanged) and
    the group settings changed, each in the field mask only if it changes."""
    group = types_pb2.GroupConfig(name=before.name)
    paths = group_settings.patch(group, settings)
    if desired is not None:
        group.consumer_config.update(desired)
        paths = ["consumer_config", *paths]
    return admin_pb2.UpdateGroupRequest(
        group=group,
        update_mask=field_mask_pb2.FieldMask(paths=paths),
        # Someone else's change in between is refused (CONFIG_VERSION_CONFLICT), not lost.
        expected_config_version=before.config_version,
        request_id=str(uuid.uuid4()),
    )


def _wait_applied(
    client: AssignerClient, group: str, version: int, wait: float, output: Output
) -> list[config_view.Doc]:
    """Every member's state for ``version``, once none is pending or after ``wait`` s."""
    deadline = time.monotonic() + wait
    with waiting(output, f"waiting for the members of {group} to apply v{version}"):
        while True:
            states = config_view.member_states(client.describe(group), version)
            if config_view.settled(states) or time.monotonic() >= deadline:
                return states
            time.sleep(WAIT_POLL_SECONDS)


def _not_applied(doc: config_view.Doc, wait: float) -> str:
    refused = [s for s in doc["members"] if s["state"] == config_view.REFUSED]
    pending = [s["sidecar_id"] for s in doc["members"] if s["state"] == config_view.PENDING]
    parts = [f"{s['sidecar_id']} refused it ({s['reason']})" for s in refused]
    if pending:
        parts.append(f"no report within {wait:g}s from {', '.join(pending)}")
    return (
        f"config v{doc['config_version']} of {doc['group']} is stored, but not every member "
        f"runs it: {'; '.join(parts)}. A member that refused it keeps its previous config."
    )


def register(app: typer.Typer) -> None:
    """Adds ``dsctl config get|set`` to the ``dsctl`` app."""
    for name, command in (("get", get), ("set", set_)):
        config_app.command(name, help=reflowed(command.__doc__), epilog=EXIT_CODES_HELP)(
            reports_errors(command)
        )
    app.add_typer(config_app, name="config")
