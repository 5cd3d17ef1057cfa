"""What ``dsctl config`` decides and shows, pure: ``KEY=VALUE`` arguments, the new config,
the diff, each member's state, and the documents and tables printed.

A member's state for version ``v`` of the group's config: ``applied`` once its heartbeats
report running ``v`` or later, ``refused`` once they report refusing ``v`` or later (it runs
the config it had), ``pending`` until then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from dataservice.assigner.v1 import admin_pb2, types_pb2
from services.dsctl import group_settings
from services.dsctl.group_settings import SettingsChange
from services.dsctl.render import MODES
from services.runtime.consumer_config import ConfigChange

Doc = dict[str, Any]

APPLIED, REFUSED, PENDING = "applied", "refused", "pending"


def parse_assignments(pairs: Sequence[str]) -> dict[str, str]:
    """``["fetch.max.bytes=1048576", ...]`` → a dict; ValueError naming a malformed one or
    a key given twice with two values."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        if key in out and out[key] != value:
            raise ValueError(f"{key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def merged(
    current: Mapping[str, str], sets: Mapping[str, str], unsets: Sequence[str]
) -> dict[str, str]:
    """The group's next consumer config: ``current`` with ``sets`` applied and ``unsets``
    removed; ValueError for a key both set and unset, or unset but not set now."""
    if both := sorted(set(sets) & set(unsets)):
        raise ValueError(f"{', '.join(both)}: both set and unset")
    if missing := sorted(k for k in unsets if k not in current):
        raise ValueError(f"--unset {', '.join(missing)}: the group does not set it")
    config = {k: v for k, v in current.items() if k not in unsets}
    config.update(sets)
    return dict(sorted(config.items()))


def change_doc(change: ConfigChange, settings: SettingsChange | None = None) -> Doc:
    """The consumer config's diff, and the group settings changed (``settings``: value
    names, null = unspecified)."""
    return {
        "added": dict(sorted(change.added.items())),
        "changed": {k: {"from": a, "to": b} for k, (a, b) in sorted(change.changed.items())},
        "removed": dict(sorted(change.removed.items())),
        "new_consumer": change.new_consumer,
        "settings": {k: {"from": a, "to": b} for k, (a, b) in sorted((settings or {}).items())},
    }


def settings_doc(cfg: types_pb2.GroupConfig) -> Doc:
    """The group settings ``config set`` changes beside the consumer config (null =
    unspecified: :data:`group_settings.SETTINGS` says what the group runs then)."""
    return {key: group_settings.value_of(cfg, key) for key in group_settings.SETTINGS}


def member_state(member: types_pb2.Member, version: int) -> Doc:
    """One member's state for ``version`` of the group's config."""
    rejection = member.config_rejection if member.HasField("config_rejection") else None
    state, reason = PENDING, None
    if rejection is not None and rejection.config_version >= version:
        state, reason = REFUSED, rejection.reason
    elif member.applied_config_version >= version:
        state = APPLIED
    return {
        "sidecar_id": member.sidecar_id,
        "runs_version": member.applied_config_version or None,
        "state": state,
        "reason": reason,
    }


def member_states(described: admin_pb2.DescribeGroupResponse, version: int) -> list[Doc]:
    return [member_state(m, version) for m in described.members]


def settled(states: Sequence[Doc]) -> bool:
    """No member is pending any more (each applied or refused)."""
    return all(s["state"] != PENDING for s in states)


def all_applied(states: Sequence[Doc]) -> bool:
    return all(s["state"] == APPLIED for s in states)


def get_doc(described: admin_pb2.DescribeGroupResponse) -> Doc:
    cfg = described.config
    return {
        "group": cfg.name,
        "mode": MODES.get(cfg.mode, "unknown"),
        "config_version": cfg.config_version,
        "consumer_config": dict(sorted(cfg.consumer_config.items())),
        "settings": settings_doc(cfg),
        "members": member_states(described, cfg.config_version),
    }


def set_doc(
    before: types_pb2.GroupConfig,
    after: types_pb2.GroupConfig,
    change: ConfigChange,
    states: Sequence[Doc],
    settings: SettingsChange | None = None,
) -> Doc:
    return {
        "group": after.name,
        "mode": MODES.get(after.mode, "unknown"),
        "previous_version": before.config_version,
        "config_version": after.config_version,
        "consumer_config": dict(sorted(after.consumer_config.items())),
        "settings": settings_doc(after),
        "changes": change_doc(change, settings),
        "members": list(states),
        "applied": all_applied(states),
    }


def what_happens(mode: str, change: ConfigChange) -> str:
    """One line on what applying ``change`` does to the group's sidecars."""
    if not change.new_consumer:
        return "recorded by every sidecar; no consumer is replaced (leased mode ignores it)"
    if mode == "kafka_group":
        return (
            "every sidecar hands its partitions back (in-flight records drained, acked offsets "
            "committed) and joins Kafka's group again with a new consumer under its static id"
        )
    return (
        "every sidecar replaces its Kafka consumer in place: leases, buffered and in-flight "
        "records stay; nothing is delivered twice"
    )


def effects(mode: str, change: ConfigChange, settings: SettingsChange) -> list[str]:
    """What applying the change does, a line for the consumer config (if it changes) and
    one for each group setting changed."""
    lines = [] if change.empty else [what_happens(mode, change)]
    return lines + [f"{key}: {group_settings.SETTINGS[key].effect}" for key in settings]


def diff_lines(changes: Doc) -> list[Text]:
    lines = [Text(f"  + {k} = {v}", style="green") for k, v in changes["added"].items()]
    lines += [
        Text(f"  ~ {k}: {c['from']} → {c['to']}", style="yellow")
        for k, c in changes["changed"].items()
    ]
    lines += [Text(f"  - {k} (was {v})", style="red") for k, v in changes["removed"].items()]
    lines += [
        Text(
            f"  ~ {k}: {group_settings.shown(k, c['from'])} → {group_settings.shown(k, c['to'])}",
            style="yellow",
        )
        for k, c in changes.get("settings", {}).items()
    ]
    return lines


def members_table(states: Sequence[Doc], version: int) -> Table:
    table = Table(title=f"members ({len(states)}) and config v{version}")
    for column in ("sidecar", "runs", "state"):
        table.add_column(column)
    style = {APPLIED: "green", REFUSED: "red", PENDING: "yellow"}
    for s in states:
        state = Text(s["state"], style=style[s["state"]])
        if s["reason"]:
            state.append(f": {s['reason']}")
        runs = f"v{s['runs_version']}" if s["runs_version"] else "?"
        table.add_row(s["sidecar_id"], runs, state)
    return table


def get_view(doc: Doc) -> RenderableType:
    header = Text.assemble(
        (doc["group"], "bold"), f" ({doc['mode']}): config v{doc['config_version']}"
    )
    config = Table.grid(padding=(0, 2))
    config.add_column(style="bold")
    config.add_column()
    for key, value in doc["consumer_config"].items():
        config.add_row(f"  {key}", value)
    if not doc["consumer_config"]:
        config.add_row("  (none)", "the sidecars' own defaults")
    settings = Table.grid(padding=(0, 2))
    settings.add_column(style="bold")
    settings.add_column()
    for key, value in doc["settings"].items():
        settings.add_row(f"  {key}", group_settings.shown(key, value))
    return RichGroup(
        header,
        Text("consumer config"),
        config,
        Text("group settings"),
        settings,
        members_table(doc["members"], doc["config_version"]),
    )


def set_view(doc: Doc) -> RenderableType:
    header = Text.assemble(
        (doc["group"], "bold"),
        f" ({doc['mode']}): config v{doc['previous_version']} → v{doc['config_version']}",
    )
    return RichGroup(
        header, *diff_lines(doc["changes"]), members_table(doc["members"], doc["config_version"])
    )
