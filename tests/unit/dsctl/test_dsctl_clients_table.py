"""``dsctl clients``: the JSON document and the table from ListClients' answer (pure)."""

from __future__ import annotations

import datetime

from dataservice.assigner.v1 import admin_pb2
from services.dsctl.clients_view import clients_doc, clients_table, wall_iso
from tests.support.render_text import text_of

NOW = datetime.datetime(2026, 11, 27, 12, 0, 0, tzinfo=datetime.UTC)
T = NOW.timestamp()


def answer() -> list[admin_pb2.ClientView]:
    return [
        admin_pb2.ClientView(
            client_id="app-1",
            group="demo",
            sidecars=[
                admin_pb2.ClientAtSidecar(
                    sidecar_id="sidecar-0", endpoint="127.0.0.1:7080", records_per_second=120.04,
                    acks_per_second=118.0, last_seen_seconds=T - 2, active_streams=1,
                ),
                admin_pb2.ClientAtSidecar(
                    sidecar_id="sidecar-1", endpoint="127.0.0.1:7082", records_per_second=80.0,
                    acks_per_second=80.0, errors_per_second=0.5, last_seen_seconds=T - 1,
                ),
            ],
            records_per_second=200.04, acks_per_second=198.0, errors_per_second=0.5,
            error_ratio=0.0125, last_seen_seconds=T - 1, bound=True,
            bound_since_seconds=T - 125,
        ),
        admin_pb2.ClientView(client_id="idle", group="demo", bound=True),
        admin_pb2.ClientView(client_id="direct", group="other", last_seen_seconds=T - 4000),
    ]  # fmt: skip


def test_the_document_has_every_figure_with_iso_times() -> None:
    doc = clients_doc(answer())
    app, idle, direct = doc["clients"]
    assert app["client_id"] == "app-1" and app["group"] == "demo"
    assert app["bound"] is True
    assert app["bound_since"] == "2026-11-27T11:57:55.000Z"
    assert app["last_seen"] == "2026-11-27T11:59:59.000Z"
    assert (app["records_per_second"], app["acks_per_second"], app["errors_per_second"]) == (
        200.04, 198.0, 0.5,
    )  # fmt: skip
    assert app["error_ratio"] == 0.0125
    assert [(s["sidecar_id"], s["endpoint"]) for s in app["sidecars"]] == [
        ("sidecar-0", "127.0.0.1:7080"),
        ("sidecar-1", "127.0.0.1:7082"),
    ]
    assert app["sidecars"][0]["active_streams"] == 1
    assert (idle["last_seen"], idle["bound_since"], idle["sidecars"]) == (None, None, [])
    assert direct["bound"] is False


def test_the_table_shows_one_row_per_client_with_ages() -> None:
    text = text_of(clients_table(clients_doc(answer()), now=NOW))
    assert "clients (3)" in text
    lines = {line.split("│")[2].strip(): line for line in text.splitlines() if "│" in line}
    app = lines["app-1"]
    for shown in ("demo", "sidecar-0, sidecar-1", "200.0", "198.0", "0.5", "1.2", "1s ago",
                  "2m05s ago"):  # fmt: skip
        assert shown in app, (shown, app)
    assert "not bound" in lines["direct"] and "1h06m ago" in lines["direct"]
    idle = lines["idle"]
    assert idle.count(" - ") >= 2  # no sidecar, never seen


def test_unknown_times_are_none() -> None:
    assert wall_iso(0.0) is None
    assert wall_iso(T) == "2026-11-27T12:00:00.000Z"
