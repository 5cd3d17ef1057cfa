"""The /ui/clients page (pure rendering): rows with their figures, ages, escaping, links."""

from __future__ import annotations

from services.assigner.client_activity import AtSidecar, ClientRow, Rates
from services.assigner.ui import render
from services.assigner.ui.model import ClientsView, Page
from tests.support.ui_html import EVIL, parse, with_attr

PAGE = Page(instance="10.0.0.1:7070", generated_at="2025-01-01T00:00:00Z")
NOW = 1_800_000_000.0


def client(client_id: str, *sidecars: AtSidecar, **kw: object) -> ClientRow:
    fields: dict[str, object] = {
        "client_id": client_id,
        "group": "demo",
        "sidecars": sidecars,
        "rates": Rates(
            records=sum(s.rates.records for s in sidecars),
            acks=sum(s.rates.acks for s in sidecars),
            errors=sum(s.rates.errors for s in sidecars),
        ),
        "error_ratio": 0.0,
        "last_seen": max((s.last_seen for s in sidecars), default=0.0),
        "bound": True,
        "bound_since": NOW - 300,
    }
    fields.update(kw)
    return ClientRow(**fields)  # type: ignore[arg-type]


def at(sidecar: str, records: float, last_seen: float = NOW - 1.5) -> AtSidecar:
    rates = Rates(records, records * 0.9, 0.0)
    return AtSidecar(sidecar, f"{sidecar}.pod:7080", rates, last_seen, 1)


def test_clients_page_rows_carry_the_figures() -> None:
    view = ClientsView(
        PAGE,
        "",
        (
            client("app-1", at("sc-0", 120.0), at("sc-1", 80.0), error_ratio=0.25),
            client("direct", at("sc-1", 5.0), bound=False, bound_since=0.0),
            client("idle"),
        ),
        NOW,
    )
    html = render.render_clients(view)
    rows = {a["data-client"]: a for a in with_attr(html, "data-client")}
    assert set(rows) == {"app-1", "direct", "idle"}
    assert rows["app-1"]["data-sidecars"] == "sc-0 sc-1"
    assert rows["app-1"]["data-records-per-second"] == "200.000"
    assert rows["app-1"]["data-acks-per-second"] == "180.000"
    assert rows["app-1"]["data-group"] == "demo" and rows["app-1"]["data-bound"] == "true"
    assert rows["direct"]["data-bound"] == "false"
    assert rows["idle"]["data-sidecars"] == ""
    assert rows["idle"]["data-records-per-second"] == "0.000"
    text = "".join(parse(html).text)
    assert "1.5 s ago" in text  # last seen
    assert "5.0 min ago" in text  # bound since
    assert "not bound" in text and "25.0" in text  # the error percentage
    assert '<meta http-equiv="refresh" content="5">' in html
    assert '<a href="/ui/clients">clients</a>' in html  # in every page's header


def test_clients_page_of_one_group_and_of_none() -> None:
    html = render.render_clients(ClientsView(PAGE, "demo", (), NOW))
    (section,) = [a for _, a in parse(html).tags if a.get("id") == "clients"]
    assert section["data-group"] == "demo" and section["data-count"] == "0"
    assert "No client bound or seen." in html


def test_clients_page_escapes_every_mesh_string() -> None:
    row = client(EVIL, at(EVIL, 1.0), group=EVIL)
    html = render.render_clients(ClientsView(PAGE, EVIL, (row,), NOW))
    assert "<script>" not in html
    assert not [t for t, _ in parse(html).tags if t == "script"]
    assert "/ui/lag?group=%3Cscript%3E" in html
