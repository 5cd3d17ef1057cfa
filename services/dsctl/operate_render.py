"""Documents and tables of dsctl's operations (pure: protobuf in, dicts and Rich out).

``offsets reset``, ``move``, ``drain``/``undrain`` and ``mode`` each print one document:
as JSON (``--output json``) or as the table built here from that same document. Unknown
values are ``null`` in JSON and ``?`` in tables, as in the read commands.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from dataservice.assigner.v1 import admin_pb2
from services.dsctl.render import config_doc, known, lease_doc

Doc = dict[str, Any]


def reset_doc(group: str, strategy: str, response: admin_pb2.ResetOffsetsResponse) -> Doc:
    return {
        "group": group,
        "strategy": strategy,
        "dry_run": response.dry_run,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "old_offset": known(p.old_offset),
                "new_offset": p.new_offset,
                "target_offset": p.target_offset,
                "clamped": p.clamped,
                "applied": p.applied,
                "epoch": p.epoch or None,
            }
            for p in response.partitions
        ],
    }


def reset_table(doc: Doc) -> Table:
    what = "dry run: nothing changed" if doc["dry_run"] else "applied"
    table = Table(title=f"offsets of {doc['group']} → {doc['strategy']} ({what})")
    for column in ("topic", "partition", "old", "new", "moved", "epoch", "note"):
        table.add_column(column, justify="right" if column not in ("topic", "note") else "left")
    for p in doc["partitions"]:
        old = p["old_offset"]
        moved = "?" if old is None else f"{p['new_offset'] - old:+,}"
        note = f"clamped from {p['target_offset']:,}" if p["clamped"] else ""
        table.add_row(
            p["topic"],
            str(p["partition"]),
            "?" if old is None else f"{old:,}",
            f"{p['new_offset']:,}",
            moved,
            str(p["epoch"] or "-"),
            note,
        )
    return table


def leases_of(described: admin_pb2.DescribeGroupResponse, sidecar: str) -> list[Doc]:
    return [lease_doc(lease) for lease in described.leases if lease.holder == sidecar]


def settled(described: admin_pb2.DescribeGroupResponse) -> bool:
    """Every partition held (no handoff under way, none unassigned)."""
    return all(lease_doc(lease)["state"] == "granted" for lease in described.leases)


def member_of(described: admin_pb2.DescribeGroupResponse, sidecar: str) -> Doc | None:
    for m in described.members:
        if m.sidecar_id == sidecar:
            return {"sidecar_id": m.sidecar_id, "endpoint": m.endpoint, "drained": m.drained}
    return None


def moves(before: Iterable[Doc], described: admin_pb2.DescribeGroupResponse) -> list[Doc]:
    """Where each lease of ``before`` is now: holder, epoch and state."""
    now = {(lease.topic, lease.partition): lease_doc(lease) for lease in described.leases}
    out = []
    for old in before:
        new = now.get((old["topic"], old["partition"]), {})
        out.append(
            {
                "topic": old["topic"],
                "partition": old["partition"],
                "from": old["holder"],
                "to": new.get("holder"),
                "epoch": new.get("epoch"),
                "state": new.get("state"),
            }
        )
    return out


def drain_doc(
    group: str, sidecar: str, *, drained: bool, moved: Sequence[Doc], held: Sequence[Doc],
    seconds: float, done: bool,
) -> Doc:  # fmt: skip
    return {
        "group": group,
        "sidecar": sidecar,
        "drained": drained,
        "done": done,
        "seconds": round(seconds, 3),
        "moved": list(moved),
        "held": [{k: h[k] for k in ("topic", "partition", "epoch", "state")} for h in held],
    }


def drain_table(doc: Doc) -> Table:
    verb = "drained" if doc["drained"] else "undrained"
    status = "done" if doc["done"] else "not done yet"
    table = Table(
        title=f"{doc['sidecar']} {verb} in {doc['group']}: {status} after {doc['seconds']:.1f}s"
    )
    for column in ("topic", "partition", "from", "to", "epoch", "state"):
        table.add_column(column)
    for m in doc["moved"]:
        table.add_row(
            m["topic"],
            str(m["partition"]),
            m["from"] or "-",
            m["to"] or "-",
            str(m["epoch"] if m["epoch"] is not None else "?"),
            _state(m["state"]),
        )
    return table


def progress_line(doc: Doc) -> Text:
    moving = [m for m in doc["moved"] if m["state"] != "granted" or m["to"] == m["from"]]
    return Text(
        f"{doc['sidecar']}: {len(doc['held'])} partition(s) held, {len(moving)} moving, "
        f"{doc['seconds']:.1f}s"
    )


def move_doc(
    group: str, topic: str, partition: int, *, before: Doc, after: Doc, seconds: float,
    done: bool,
) -> Doc:  # fmt: skip
    return {
        "group": group,
        "topic": topic,
        "partition": partition,
        "from": before.get("holder"),
        "to": after.get("holder"),
        "epoch_before": before.get("epoch"),
        "epoch": after.get("epoch"),
        "state": after.get("state"),
        "done": done,
        "seconds": round(seconds, 3),
    }


def move_table(doc: Doc) -> Table:
    status = "done" if doc["done"] else "not done yet"
    table = Table(title=f"move of {doc['topic']}/{doc['partition']} in {doc['group']}: {status}")
    for column in ("from", "epoch", "to", "new epoch", "state", "seconds"):
        table.add_column(column)
    table.add_row(
        doc["from"] or "-",
        str(doc["epoch_before"]),
        doc["to"] or "-",
        str(doc["epoch"]),
        _state(doc["state"]),
        f"{doc['seconds']:.2f}",
    )
    return table


def mode_doc(
    group: str, before: str, response: admin_pb2.UpdateGroupResponse, seconds: float
) -> Doc:
    config = config_doc(response.group)
    return {
        "group": group,
        "mode_before": before,
        "mode": config["mode"],
        "config_version": config["config_version"],
        "seconds": round(seconds, 3),
    }


def mode_table(doc: Doc) -> Table:
    table = Table(title=f"mode of {doc['group']}")
    for column in ("before", "now", "config version", "switched in"):
        table.add_column(column)
    table.add_row(
        doc["mode_before"], doc["mode"], str(doc["config_version"]), f"{doc['seconds']:.1f}s"
    )
    return table


def external_table(doc: Doc) -> Table:
    table = Table(title=f"external offset changes of {doc['group']}")
    for column in ("before", "now", "config version"):
        table.add_column(column)
    table.add_row(
        doc["external_offset_changes_before"],
        doc["external_offset_changes"],
        str(doc["config_version"]),
    )
    return table


def _state(state: str | None) -> str:
    return state or "?"
