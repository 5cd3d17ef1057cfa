"""``dsctl apply -f`` / ``dsctl diff -f`` / ``dsctl get group``: groups declared in DsGroup
YAML (the resource a cluster reconciles, deploy/k8s/base/crds/dsgroup.yaml) applied to the
mesh outside Kubernetes, so git holds the truth either way.

``apply`` reads each group the file declares (``DescribeGroup``), then creates the missing
ones (``CreateGroup``) and updates those that differ in a field the document manages
(:mod:`services.dsctl.group_manifest`: topics, mode and what it sets; ``UpdateGroup``
with exactly the changed fields as its mask and ``expected_config_version`` = the version
read, so a change made in between is refused, not overwritten); a group that already
matches is not written at all, so a second apply changes nothing and says so. Each write
carries a fresh ``request_id`` (a retry inside the call is applied once). Groups the file
does not name are left alone unless ``--prune`` (opt-in): then every other group of the
mesh is shown as a diff to /dev/null and deleted (``DeleteGroup``, never forced: a group
with bound clients is refused and reported, and the command exits 1); ``--dry-run`` shows
the plan and writes nothing. ``diff`` shows what ``apply`` would do, as a unified diff of
the fields each document manages (``--prune``: and the groups it would delete), and exits
1 when something would change (like ``kubectl diff``). ``dsctl delete group X [--force]``
deletes one group.
"""

from __future__ import annotations

import difflib
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.dsctl import group_manifest as manifest
from services.dsctl.admin_client import (
    DEFAULT_ASSIGNER,
    DEFAULT_TIMEOUT_SECONDS,
    EXIT_CODES_HELP,
    AssignerClient,
    CliError,
    ExitCode,
)
from services.dsctl.read import AssignerOption, TimeoutOption, console, reflowed, reports_errors

FileOption = Annotated[
    Path,
    typer.Option(
        "--filename", "-f", exists=True, dir_okay=False, help="YAML file of DsGroup documents."
    ),
]

PruneOption = Annotated[
    bool,
    typer.Option(
        "--prune",
        help="Also delete the groups of the mesh the file does not declare (never forced: "
        "one with bound clients is refused).",
    ),
]

get_app = typer.Typer(help="Show a resource as a document.", no_args_is_help=True)
delete_app = typer.Typer(help="Delete a resource.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Adds ``dsctl apply``, ``dsctl diff`` and ``dsctl get group`` to the ``dsctl`` app."""
    for name, command in (("apply", apply), ("diff", diff)):
        app.command(name, help=reflowed(command.__doc__), epilog=EXIT_CODES_HELP)(
            reports_errors(command)
        )
    get_app.command("group", help=reflowed(get_group.__doc__), epilog=EXIT_CODES_HELP)(
        reports_errors(get_group)
    )
    app.add_typer(get_app, name="get")
    delete_app.command("group", help=reflowed(delete_group.__doc__), epilog=EXIT_CODES_HELP)(
        reports_errors(delete_group)
    )
    app.add_typer(delete_app, name="delete")


def load_documents(path: Path) -> list[dict[str, Any]]:
    """The DsGroup documents of ``path`` (empty documents skipped; anything else refused)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not YAML: {exc}", ExitCode.ERROR) from None
    for doc in docs:
        if not isinstance(doc, dict):
            raise CliError(f"{path}: every document must be a mapping", ExitCode.ERROR)
    return docs


def live_configs(client: AssignerClient, names: list[str]) -> dict[str, types_pb2.GroupConfig]:
    """The current config of each named group that exists."""
    live: dict[str, types_pb2.GroupConfig] = {}
    for name in names:
        try:
            live[name] = client.describe(name).config
        except CliError as err:
            if err.exit_code is not ExitCode.NOT_FOUND:
                raise
    return live


def _plan(client: AssignerClient, docs: list[dict[str, Any]]) -> list[manifest.Change]:
    try:
        names = [manifest.group_name(doc) for doc in docs]
        return manifest.plan(docs, live_configs(client, names))
    except manifest.ManifestError as exc:
        raise CliError(str(exc), ExitCode.ERROR) from None


def _write(
    client: AssignerClient, change: manifest.Change, live: types_pb2.GroupConfig | None
) -> types_pb2.GroupConfig:
    if change.action == "create":
        created = client.create_group(
            admin_pb2.CreateGroupRequest(group=change.desired, request_id=str(uuid.uuid4()))
        )
        return created.group
    assert live is not None
    updated = client.update_group(
        admin_pb2.UpdateGroupRequest(
            group=change.desired,
            update_mask=field_mask_pb2.FieldMask(paths=list(change.paths)),
            expected_config_version=live.config_version,
            request_id=str(uuid.uuid4()),
        )
    )
    return updated.group


def prune_targets(client: AssignerClient, declared: list[str]) -> list[types_pb2.GroupConfig]:
    """The live groups ``--prune`` deletes: every group of the mesh not declared, by name."""
    keep = set(declared)
    return [g.config for g in client.list_groups() if g.config.name not in keep]


def prune_diff(config: types_pb2.GroupConfig) -> list[str]:
    """The diff of a group ``--prune`` deletes: its live spec to /dev/null."""
    before = yaml.safe_dump(manifest.spec_of(config), sort_keys=True).splitlines()
    return list(
        difflib.unified_diff(
            before, [], fromfile=f"live/{config.name}", tofile="/dev/null", lineterm=""
        )
    )


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        console.print(line, highlight=False, markup=False)


def _prune(client: AssignerClient, targets: list[types_pb2.GroupConfig]) -> tuple[int, int]:
    """Delete ``targets`` (never forced); (deleted, refused)."""
    deleted = refused = 0
    for config in targets:
        try:
            client.delete_group(
                admin_pb2.DeleteGroupRequest(group=config.name, request_id=str(uuid.uuid4()))
            )
        except CliError as err:
            if err.exit_code is ExitCode.NOT_FOUND:  # gone meanwhile: what prune wants
                console.print(f"dsgroup/{config.name} already gone", highlight=False)
                continue
            refused += 1
            console.print(f"dsgroup/{config.name} not pruned: {err}", highlight=False)
            continue
        deleted += 1
        console.print(f"dsgroup/{config.name} pruned", highlight=False)
    return deleted, refused


def apply(
    filename: FileOption,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
    prune: PruneOption = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would change; write nothing.")
    ] = False,
) -> None:
    """Create or update the groups the file declares, so that each matches its document;
    a group that already matches is not written. One line per group (created, configured
    with the changed fields, or unchanged) and a count. Groups the file does not name are
    left alone, unless --prune: then each is shown as a diff to /dev/null first and
    deleted (never forced: one with bound clients is refused, and the exit code is 1).
    --dry-run prints the plan (as `dsctl diff`) and writes nothing."""
    docs = load_documents(filename)
    with AssignerClient(assigner, timeout) as client:
        changes = _plan(client, docs)
        live = live_configs(client, [c.group for c in changes if c.action == "update"])
        targets = prune_targets(client, [c.group for c in changes]) if prune else []
        for config in targets:
            _print_lines(prune_diff(config))
        if dry_run:
            for change in changes:
                if change.action != "unchanged":
                    _print_lines(_change_diff(change, live.get(change.group)))
            console.print(
                f"dry run: {sum(c.action == 'create' for c in changes)} to create, "
                f"{sum(c.action == 'update' for c in changes)} to configure, "
                f"{len(targets)} to prune; nothing written",
                highlight=False,
            )
            return
        counts = {"created": 0, "configured": 0, "unchanged": 0}
        for change in changes:
            if change.action == "unchanged":
                counts["unchanged"] += 1
                console.print(f"dsgroup/{change.group} unchanged", highlight=False)
                continue
            after = _write(client, change, live.get(change.group))
            if change.action == "create":
                counts["created"] += 1
                console.print(
                    f"dsgroup/{change.group} created (config v{after.config_version})",
                    highlight=False,
                )
            else:
                counts["configured"] += 1
                console.print(
                    f"dsgroup/{change.group} configured: {', '.join(change.paths)} "
                    f"(config v{after.config_version})",
                    highlight=False,
                )
        pruned, refused = _prune(client, targets)
    if prune:
        counts["pruned"] = pruned
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    if counts["created"] == counts["configured"] == pruned == 0:
        summary += ": nothing changed"
    console.print(summary, highlight=False)
    if refused:
        raise CliError(f"{refused} group(s) not pruned (see above)", ExitCode.ERROR)


def _change_diff(change: manifest.Change, current: types_pb2.GroupConfig | None) -> list[str]:
    return spec_diff(
        change.group,
        None if current is None else manifest.managed_spec(current, change.keys),
        manifest.managed_spec(change.desired, change.keys),
    )


def spec_diff(group: str, current: dict[str, Any] | None, desired: dict[str, Any]) -> list[str]:
    """A unified diff of a group's spec, live (or nothing) to declared."""
    before = [] if current is None else yaml.safe_dump(current, sort_keys=True).splitlines()
    after = yaml.safe_dump(desired, sort_keys=True).splitlines()
    return list(
        difflib.unified_diff(
            before,
            after,
            fromfile=f"live/{group}" if current is not None else "/dev/null",
            tofile=f"declared/{group}",
            lineterm="",
        )
    )


def diff(
    filename: FileOption,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
    prune: PruneOption = False,
) -> None:
    """Show what `dsctl apply -f` would change: a unified diff of the fields each document
    manages, live to declared (a new group against /dev/null; with --prune, each group
    the file does not declare from live to /dev/null). Exit 0 when nothing would change,
    1 when something would (like `kubectl diff`); nothing is written either way."""
    docs = load_documents(filename)
    with AssignerClient(assigner, timeout) as client:
        changes = _plan(client, docs)
        live = live_configs(client, [c.group for c in changes if c.action == "update"])
        targets = prune_targets(client, [c.group for c in changes]) if prune else []
    differs = bool(targets)
    for config in targets:
        _print_lines(prune_diff(config))
    for change in changes:
        if change.action == "unchanged":
            continue
        differs = True
        _print_lines(_change_diff(change, live.get(change.group)))
    if differs:
        raise typer.Exit(int(ExitCode.ERROR))


def get_group(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    output: Annotated[
        str, typer.Option("--output", "-o", help="yaml (the only format: a DsGroup document).")
    ] = "yaml",
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """The group as a DsGroup document, its status from the live mesh (members, partitions
    held, lag, config version): save it, and `dsctl apply -f` of the file changes nothing."""
    if output != "yaml":
        raise CliError(f"--output {output!r}: only yaml", ExitCode.ERROR)
    with AssignerClient(assigner, timeout) as client:
        described = client.describe(group)
    print(yaml.safe_dump(manifest.document_of(described), sort_keys=False), end="")


def delete_group(
    group: Annotated[str, typer.Argument(help="The group's name.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Delete even while clients are bound (their bindings are dropped)."
        ),
    ] = False,
    assigner: AssignerOption = DEFAULT_ASSIGNER,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Delete a group (AdminService.DeleteGroup): its configuration, bindings and drains go,
    its sidecars' sessions end. Refused while application clients are bound (they are
    named), unless --force. Kafka's committed offsets of the group are kept. Audited (a
    GROUP_DELETED fault event)."""
    if not group.strip():
        raise CliError("GROUP must not be empty", ExitCode.ERROR)
    with AssignerClient(assigner, timeout) as client:
        deleted = client.delete_group(
            admin_pb2.DeleteGroupRequest(group=group, force=force, request_id=str(uuid.uuid4()))
        )
    dropped = (
        f"; bindings dropped: {', '.join(deleted.unbound_clients)}"
        if deleted.unbound_clients
        else ""
    )
    console.print(
        f"dsgroup/{group} deleted (config v{deleted.group.config_version}){dropped}",
        highlight=False,
    )
