"""What dsctl's read commands show: protobuf answers → JSON-able documents → Rich tables.

Pure functions only (no I/O, no clock): each command builds one document with the
``*_doc`` functions, prints it as JSON with ``--output json``, or hands the same document
to the matching ``*_table`` function, so the two outputs never disagree. Unknown values
are ``null`` in JSON (the protos' ``-1``) and ``?`` in tables.

One job, why whole (about 610 lines): dsctl's read commands' output, pure. Each command has
a *_doc and a *_table function that must agree; they share the formatting helpers
(durations, unknown values, offsets), and keeping the pairs together is what keeps JSON and
table output from drifting apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2
from rich.console import Group as RichGroup
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.runtime.faults import event_fields
from services.runtime.group_enums import (
    BALANCE_STRATEGIES,
    COMMIT_FENCINGS,
    EXTERNAL_OFFSET_CHANGES,
    ORDERINGS,
)

Doc = dict[str, Any]
PartitionKey = tuple[str, str, int]  # (group, topic, partition)

MODES: Mapping[int, str] = {
    common_pb2.GROUP_MODE_UNSPECIFIED: "unspecified",
    common_pb2.GROUP_MODE_LEASED: "leased",
    common_pb2.GROUP_MODE_KAFKA_GROUP: "kafka_group",
}
UNASSIGNED = "(unassigned)"
BAR_WIDTH = 20


# --- small value helpers -------------------------------------------------------------------


def known(value: int) -> int | None:
    """A proto int where -1 (or any negative) means "unknown/none" → ``None``."""
    return value if value >= 0 else None


def known_seconds(value: float) -> float | None:
    return round(value, 3) if value >= 0 else None


def iso(ts: timestamp_pb2.Timestamp | None) -> str | None:
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return None
    return ts.ToJsonString()


def seconds_of(d: duration_pb2.Duration, present: bool) -> float | None:
    return d.ToNanoseconds() / 1e9 if present else None


def lease_state(value: int) -> str:
    return types_pb2.LeaseState.Name(value).removeprefix("LEASE_STATE_").lower()  # type: ignore[arg-type]


def human_seconds(value: float | None) -> str:
    """``?``, ``0s``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if value is None:
        return "?"
    if value < 60:
        return f"{value:.1f}s" if value % 1 else f"{value:.0f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _lag_text(lag: int | None) -> Text:
    if lag is None:
        return Text("?", style="dim")
    return Text(f"{lag:,}", style="green" if lag == 0 else "yellow")


# --- groups --------------------------------------------------------------------------------


def group_summary_doc(summary: admin_pb2.GroupSummary) -> Doc:
    return {
        "name": summary.config.name,
        "mode": MODES.get(summary.config.mode, "unknown"),
        "topics": list(summary.config.topics),
        "members": summary.member_count,
        "partitions": summary.partition_count,
        "total_lag": known(summary.total_lag),
    }


def groups_doc(summaries: Iterable[admin_pb2.GroupSummary]) -> Doc:
    return {"groups": [group_summary_doc(s) for s in summaries]}


def groups_table(doc: Doc) -> Table:
    table = Table(title=f"groups ({len(doc['groups'])})")
    for column in ("group", "mode", "topics", "members", "partitions"):
        table.add_column(column, justify="right" if column in ("members", "partitions") else "left")
    table.add_column("total lag", justify="right")
    for g in doc["groups"]:
        table.add_row(
            g["name"],
            g["mode"],
            ", ".join(g["topics"]),
            str(g["members"]),
            str(g["partitions"]),
            _lag_text(g["total_lag"]),
        )
    return table


# --- lag -----------------------------------------------------------------------------------


def partition_lag_doc(p: admin_pb2.PartitionLag) -> Doc:
    return {
        "topic": p.topic,
        "partition": p.partition,
        "committed": known(p.committed_offset),
        "end": p.end_offset,
        "lag_records": p.lag_records,
        "lag_seconds": known_seconds(p.lag_seconds),
    }


def group_lag_doc(described: admin_pb2.DescribeGroupResponse) -> Doc:
    partitions = [partition_lag_doc(p) for p in described.partitions]
    ages = [p["lag_seconds"] for p in partitions]
    return {
        "group": described.config.name,
        "total_lag": sum(p["lag_records"] for p in partitions),
        # Unknown when any lagging partition's age is unknown: never understate it.
        "max_lag_seconds": None if None in ages else max(ages, default=0.0),
        "partitions": partitions,
    }


def lag_doc(described: Iterable[admin_pb2.DescribeGroupResponse]) -> Doc:
    return {"groups": [group_lag_doc(d) for d in described]}


def lag_over(doc: Doc, max_lag: int) -> list[str]:
    """Groups whose total lag (records) is above ``max_lag``."""
    return [g["group"] for g in doc["groups"] if g["total_lag"] > max_lag]


def lag_table(doc: Doc) -> Table:
    table = Table(title="lag")
    table.add_column("group")
    table.add_column("topic")
    for column in ("partition", "committed", "end", "lag", "lag age"):
        table.add_column(column, justify="right")
    for g in doc["groups"]:
        for p in g["partitions"]:
            table.add_row(
                g["group"],
                p["topic"],
                str(p["partition"]),
                count(p["committed"]),
                f"{p['end']:,}",
                _lag_text(p["lag_records"]),
                human_seconds(p["lag_seconds"]),
            )
        table.add_row(
            Text(g["group"], style="bold"),
            Text("total", style="bold"),
            "",
            "",
            "",
            _lag_text(g["total_lag"]),
            human_seconds(g["max_lag_seconds"]),
            end_section=True,
        )
    return table


# --- describe ------------------------------------------------------------------------------


def config_doc(cfg: types_pb2.GroupConfig) -> Doc:
    return {
        "name": cfg.name,
        "topics": list(cfg.topics),
        "mode": MODES.get(cfg.mode, "unknown"),
        "balance_strategy": BALANCE_STRATEGIES.get(cfg.balance_strategy, "unknown"),
        # null = the assigner's default.
        "lease_ttl_seconds": seconds_of(cfg.lease_ttl, cfg.HasField("lease_ttl")),
        "heartbeat_interval_seconds": seconds_of(
            cfg.heartbeat_interval, cfg.HasField("heartbeat_interval")
        ),
        "alert_template": cfg.alert_template,
        "consumer_config": dict(sorted(cfg.consumer_config.items())),
        "config_version": cfg.config_version,
        "external_offset_changes": EXTERNAL_OFFSET_CHANGES.get(
            cfg.external_offset_changes, "unknown"
        ),
        # "" = the sidecars' dead_letter_topic setting.
        "dead_letter_topic": cfg.dead_letter_topic,
        "ordering": ORDERINGS.get(cfg.ordering, "unknown"),
        # "" = the sidecars' commit_fencing setting.
        "commit_fencing": COMMIT_FENCINGS.get(cfg.commit_fencing, "unknown"),
    }


def member_doc(m: types_pb2.Member) -> Doc:
    return {
        "sidecar_id": m.sidecar_id,
        "endpoint": m.endpoint,
        "zone": m.zone,
        "capacity": m.capacity,
        "drained": m.drained,
        "joined_at": iso(m.joined_at),
        "last_heartbeat": iso(m.last_heartbeat),
        # The group config version the sidecar runs (null: not reported yet), and the
        # newest one it refused.
        "applied_config_version": m.applied_config_version or None,
        "config_rejection": rejection_doc(m),
    }


def rejection_doc(m: types_pb2.Member) -> Doc | None:
    if not m.HasField("config_rejection"):
        return None
    return {
        "config_version": m.config_rejection.config_version,
        "reason": m.config_rejection.reason,
    }


def lease_doc(lease: types_pb2.Lease) -> Doc:
    return {
        "topic": lease.topic,
        "partition": lease.partition,
        "holder": lease.holder or None,
        "epoch": lease.epoch,
        "state": lease_state(lease.state),
        "expires_at": iso(lease.expires_at) if lease.HasField("expires_at") else None,
    }


def binding_doc(b: types_pb2.Binding) -> Doc:
    return {
        "group": b.group,
        "client_id": b.client_id,
        "version": b.version,
        "endpoints": [
            {
                "sidecar_id": e.sidecar_id,
                "address": e.address,
                "zone": e.zone,
                "partitions": [
                    {"topic": tp.topic, "partition": tp.partition} for tp in e.partitions
                ],
            }
            for e in b.endpoints
        ],
    }


def describe_doc(described: admin_pb2.DescribeGroupResponse) -> Doc:
    return {
        "group": described.config.name,
        "config": config_doc(described.config),
        "members": [member_doc(m) for m in described.members],
        "leases": [lease_doc(lease) for lease in described.leases],
        # With who wrote each committed offset: a holder, a reset through the mesh, external.
        "partitions": [
            {**partition_lag_doc(p), "committed_by": p.committed_by or None}
            for p in described.partitions
        ],
        "bindings": [binding_doc(b) for b in described.bindings],
    }


def describe_view(doc: Doc) -> RenderableType:
    cfg = doc["config"]
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column()
    header.add_row("group", f"{doc['group']}  (config v{cfg['config_version']})")
    header.add_row("topics", ", ".join(cfg["topics"]))
    header.add_row("mode", f"{cfg['mode']}, balance {cfg['balance_strategy']}")
    ttl, beat = cfg["lease_ttl_seconds"], cfg["heartbeat_interval_seconds"]
    header.add_row(
        "leases",
        f"ttl {'default' if ttl is None else human_seconds(ttl)}, "
        f"heartbeat {'default' if beat is None else human_seconds(beat)}",
    )
    header.add_row("alert template", cfg["alert_template"] or "-")
    header.add_row("external offset changes", cfg["external_offset_changes"])
    header.add_row("ordering", cfg["ordering"])
    header.add_row("commit fencing", cfg["commit_fencing"] or "(the sidecars' setting)")
    header.add_row(
        "consumer config",
        ", ".join(f"{k}={v}" for k, v in cfg["consumer_config"].items()) or "-",
    )

    members = Table(title=f"members ({len(doc['members'])})")
    for column in ("sidecar", "endpoint", "zone", "capacity", "joined", "last heartbeat", "config"):
        members.add_column(column)
    for m in doc["members"]:
        members.add_row(
            m["sidecar_id"],
            m["endpoint"],
            m["zone"] or "-",
            "0 (drained)" if m.get("drained") else str(m["capacity"] or "∞"),
            m["joined_at"] or "-",
            m["last_heartbeat"] or "-",
            member_config_text(m),
        )

    return RichGroup(header, members, partitions_table(doc), bindings_table(doc["bindings"]))


def member_config_text(m: Doc) -> str:
    """``v3``, ``v3 (v4 refused)`` or ``?`` for a member doc."""
    text = f"v{m['applied_config_version']}" if m["applied_config_version"] else "?"
    if m["config_rejection"] is not None:
        text += f" (v{m['config_rejection']['config_version']} refused)"
    return text


def partitions_table(doc: Doc) -> Table:
    """Leases and offsets side by side, one row per partition."""
    leases = {(lease["topic"], lease["partition"]): lease for lease in doc["leases"]}
    table = Table(title="partitions")
    table.add_column("topic")
    table.add_column("partition", justify="right")
    table.add_column("holder")
    table.add_column("epoch", justify="right")
    table.add_column("state")
    table.add_column("lease expires")
    for column in ("committed", "end", "lag", "lag age"):
        table.add_column(column, justify="right")
    table.add_column("committed by")
    lag_rows = {(p["topic"], p["partition"]): p for p in doc["partitions"]}
    for key in sorted(leases.keys() | lag_rows.keys()):
        lease = leases.get(key, {})
        p = lag_rows.get(key)
        table.add_row(
            key[0],
            str(key[1]),
            lease.get("holder") or "-",
            str(lease.get("epoch", "-")),
            lease.get("state", "-"),
            lease.get("expires_at") or "-",
            count(p["committed"]) if p else "?",
            f"{p['end']:,}" if p else "?",
            _lag_text(p["lag_records"] if p else None),
            human_seconds(p["lag_seconds"] if p else None),
            (p["committed_by"] or "-") if p else "?",
        )
    return table


# --- bindings ------------------------------------------------------------------------------


def bindings_doc(described: Iterable[admin_pb2.DescribeGroupResponse]) -> Doc:
    return {"bindings": [binding_doc(b) for d in described for b in d.bindings]}


def bindings_table(bindings: Sequence[Doc]) -> Table:
    table = Table(title=f"bindings ({len(bindings)})")
    for column in ("group", "client", "version", "sidecar", "address", "partitions"):
        table.add_column(column)
    for b in bindings:
        endpoints = b["endpoints"] or [None]
        for i, e in enumerate(endpoints):
            first = i == 0
            table.add_row(
                b["group"] if first else "",
                b["client_id"] if first else "",
                str(b["version"]) if first else "",
                e["sidecar_id"] if e else "(none yet)",
                e["address"] if e else "-",
                _partitions_text(e["partitions"]) if e else "-",
            )
    return table


def _partitions_text(partitions: Sequence[Doc]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp["topic"], []).append(tp["partition"])
    return "; ".join(
        f"{topic}[{','.join(map(str, sorted(ps)))}]" for topic, ps in sorted(by_topic.items())
    )


# --- faults --------------------------------------------------------------------------------


def fault_doc(event: common_pb2.FaultEvent) -> Doc:
    return event_fields(event)


def faults_doc(events: Iterable[common_pb2.FaultEvent]) -> Doc:
    return {"faults": [fault_doc(e) for e in events]}


SEVERITY_STYLE = {"INFO": "cyan", "WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}


def fault_row(f: Doc) -> list[RenderableType]:
    where = f["topic"]
    if f["partitions"]:
        where += f"[{','.join(map(str, f['partitions']))}]"
    who = f["consumer_id"] or f["client_id"] or f"{f['source_service']}/{f['source_instance']}"
    state_style = "green" if f["state"] == "RESOLVED" else ""
    return [
        f["detected_at"] or "-",
        Text(f["severity"], style=SEVERITY_STYLE.get(f["severity"], "")),
        f["type"],
        Text(f["state"], style=state_style),
        f["group"] or "-",
        where or "-",
        who,
        f["message"] + (f" (+{f['suppressed_count']} suppressed)" if f["suppressed_count"] else ""),
    ]


FAULT_COLUMNS = ("detected", "severity", "type", "state", "group", "where", "who", "message")


def faults_table(faults: Sequence[Doc], title: str = "faults") -> Table:
    table = Table(title=f"{title} ({len(faults)})")
    for column in FAULT_COLUMNS:
        table.add_column(column, overflow="fold")
    for f in faults:
        table.add_row(*fault_row(f))
    return table


# --- top -----------------------------------------------------------------------------------


def committed_offsets(
    described: Iterable[admin_pb2.DescribeGroupResponse],
) -> dict[PartitionKey, int]:
    """(group, topic, partition) → the group's position: its committed offset, or, for a
    partition with nothing committed yet, where consumption starts (the end offset minus
    the lag, which then counts every record in the log). So the first commit on a
    partition counts the records it covers instead of being skipped. Partitions whose
    offsets are unknown (-1) are absent."""
    positions: dict[PartitionKey, int] = {}
    for d in described:
        for p in d.partitions:
            key = (d.config.name, p.topic, p.partition)
            if p.committed_offset >= 0:
                positions[key] = p.committed_offset
            elif p.end_offset >= 0 and p.lag_records >= 0:
                positions[key] = max(0, p.end_offset - p.lag_records)
    return positions


def consumed_since(
    before: Mapping[PartitionKey, int], after: Mapping[PartitionKey, int]
) -> dict[PartitionKey, int]:
    """Records committed per partition between two samples. A partition without a commit
    in either sample is absent (no rate); an offset reset backwards counts as 0."""
    return {key: max(0, after[key] - before[key]) for key in after.keys() & before.keys()}


def imbalance(partition_counts: Sequence[int]) -> float | None:
    """max/mean partitions per member (1.0 = perfectly even); None without members or
    partitions."""
    total = sum(partition_counts)
    if not partition_counts or total == 0:
        return None
    return round(max(partition_counts) / (total / len(partition_counts)), 3)


def top_doc(
    described: Sequence[admin_pb2.DescribeGroupResponse],
    consumed: Mapping[PartitionKey, int] | None,
    elapsed: float | None,
) -> Doc:
    """Distribution per group and sidecar. Rates are records committed per second over
    ``elapsed``, credited to each partition's current holder; ``None`` before the first
    interval."""

    def per_second(n: int) -> float | None:
        if consumed is None or not elapsed:
            return None
        return round(n / elapsed, 3)

    groups = []
    # Across groups, per sidecar: [groups, partitions, records].
    totals: dict[str, list[int]] = {}
    for d in described:
        name = d.config.name
        holders = {(lease.topic, lease.partition): lease.holder for lease in d.leases}
        partitions: dict[str, int] = {m.sidecar_id: 0 for m in d.members}
        records: dict[str, int] = {m.sidecar_id: 0 for m in d.members}
        endpoints = {m.sidecar_id: m.endpoint for m in d.members}
        for p in d.partitions:
            holder = holders.get((p.topic, p.partition)) or UNASSIGNED
            partitions[holder] = partitions.get(holder, 0) + 1
            done = (consumed or {}).get((name, p.topic, p.partition), 0)
            records[holder] = records.get(holder, 0) + done
        order = sorted(partitions, key=_unassigned_last)
        member_counts = [partitions[m.sidecar_id] for m in d.members]
        groups.append(
            {
                "group": name,
                "members": len(d.members),
                "partitions": len(d.partitions),
                "unassigned": partitions.get(UNASSIGNED, 0),
                "imbalance": imbalance(member_counts),
                # The count-balance bound (ARCHITECTURE §3): max - min <= 1 per group.
                "balanced": max(member_counts) - min(member_counts) <= 1 if member_counts else None,
                "records_per_second": per_second(sum(records.values())),
                "sidecars": [
                    {
                        "sidecar_id": sidecar,
                        "endpoint": endpoints.get(sidecar, ""),
                        "partitions": partitions[sidecar],
                        "records_per_second": per_second(records[sidecar]),
                    }
                    for sidecar in order
                ],
            }
        )
        for sidecar in order:
            total = totals.setdefault(sidecar, [0, 0, 0])
            total[0] += 1
            total[1] += partitions[sidecar]
            total[2] += records[sidecar]
    return {
        "interval_seconds": round(elapsed, 3) if elapsed else None,
        "groups": groups,
        "sidecars": [
            {
                "sidecar_id": sidecar,
                "groups": totals[sidecar][0],
                "partitions": totals[sidecar][1],
                "records_per_second": per_second(totals[sidecar][2]),
            }
            for sidecar in sorted(totals, key=_unassigned_last)
        ],
    }


def _unassigned_last(sidecar: str) -> tuple[bool, str]:
    return sidecar == UNASSIGNED, sidecar


def bar(value: int, largest: int, width: int = BAR_WIDTH) -> str:
    if largest <= 0:
        return ""
    filled = round(width * value / largest)
    return "█" * filled + "·" * (width - filled)


def top_table(doc: Doc) -> Table:
    interval = doc["interval_seconds"]
    title = "distribution" + (f" (records/s over {interval:g}s)" if interval else "")
    table = Table(title=title)
    table.add_column("group")
    table.add_column("sidecar")
    table.add_column("endpoint")
    table.add_column("partitions", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("records/s", justify="right")
    for g in doc["groups"]:
        largest = max((s["partitions"] for s in g["sidecars"]), default=0)
        for s in g["sidecars"]:
            style = "red" if s["sidecar_id"] == UNASSIGNED and s["partitions"] else ""
            table.add_row(
                g["group"],
                Text(s["sidecar_id"], style=style),
                s["endpoint"] or "-",
                str(s["partitions"]),
                bar(s["partitions"], largest),
                rate(s["records_per_second"]),
            )
        ratio = g["imbalance"]
        ratio_text = Text(
            "imbalance ?" if ratio is None else f"imbalance {ratio:.2f}",
            style={True: "green", False: "yellow", None: "dim"}[g["balanced"]],
        )
        table.add_row(
            Text(g["group"], style="bold"),
            Text(f"{g['members']} members", style="bold"),
            ratio_text,
            Text(str(g["partitions"]), style="bold"),
            "",
            Text(rate(g["records_per_second"]), style="bold"),
            end_section=True,
        )
    return table
