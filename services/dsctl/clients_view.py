"""``dsctl clients``: the application clients of the groups as a document and a table (pure).

The document is what ``--output json`` prints: per client its group, binding, last seen and
rates summed over its sidecars, and the same per sidecar. Times are ISO 8601 UTC (None when
unknown); the table shows them as ages relative to ``now``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from rich.table import Table
from rich.text import Text

from dataservice.assigner.v1 import admin_pb2
from services.dsctl.render import Doc, human_seconds


def wall_iso(seconds: float) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC; None for 0 (unknown)."""
    if seconds <= 0:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _rate(value: float) -> float:
    return round(value, 3)


def client_doc(c: admin_pb2.ClientView) -> Doc:
    return {
        "group": c.group,
        "client_id": c.client_id,
        "bound": c.bound,
        "bound_since": wall_iso(c.bound_since_seconds),
        "last_seen": wall_iso(c.last_seen_seconds),
        "records_per_second": _rate(c.records_per_second),
        "acks_per_second": _rate(c.acks_per_second),
        "errors_per_second": _rate(c.errors_per_second),
        "error_ratio": round(c.error_ratio, 4),
        "sidecars": [
            {
                "sidecar_id": s.sidecar_id,
                "endpoint": s.endpoint,
                "records_per_second": _rate(s.records_per_second),
                "acks_per_second": _rate(s.acks_per_second),
                "errors_per_second": _rate(s.errors_per_second),
                "last_seen": wall_iso(s.last_seen_seconds),
                "active_streams": s.active_streams,
            }
            for s in c.sidecars
        ],
    }


def clients_doc(clients: Iterable[admin_pb2.ClientView]) -> Doc:
    return {"clients": [client_doc(c) for c in clients]}


def _age(iso: str | None, now: datetime.datetime) -> str:
    if iso is None:
        return "-"
    then = datetime.datetime.fromisoformat(iso)
    return f"{human_seconds(max(0.0, (now - then).total_seconds()))} ago"


def clients_table(doc: Doc, now: datetime.datetime | None = None) -> Table:
    """One row per client: its sidecars, its rates summed over them, last seen, bound since
    (ages); errors/s in red when above 0."""
    now = now or datetime.datetime.now(datetime.UTC)
    clients = doc["clients"]
    table = Table(title=f"clients ({len(clients)})")
    table.add_column("group")
    table.add_column("client")
    table.add_column("sidecars")
    for column in ("records/s", "acks/s", "errors/s", "error %"):
        table.add_column(column, justify="right")
    table.add_column("last seen")
    table.add_column("bound since")
    for c in clients:
        errors = c["errors_per_second"]
        table.add_row(
            c["group"],
            c["client_id"],
            ", ".join(s["sidecar_id"] for s in c["sidecars"]) or "-",
            f"{c['records_per_second']:,.1f}",
            f"{c['acks_per_second']:,.1f}",
            Text(f"{errors:,.1f}", style="red" if errors > 0 else ""),
            f"{100 * c['error_ratio']:.1f}",
            _age(c["last_seen"], now),
            _age(c["bound_since"], now) if c["bound"] else "not bound",
        )
    return table
