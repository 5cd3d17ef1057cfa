"""The /ui pages' pure parts: lag history (Burrow status, ring buffer), SVG charts, HTML."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.assigner.ui import render
from services.assigner.ui.charts import bar_chart_svg, sparkline_svg
from services.assigner.ui.history import LagHistory
from services.assigner.ui.model import (
    BindingRow,
    BrokerLoad,
    DistributionView,
    FaultRow,
    Faults,
    GroupDistribution,
    GroupSummary,
    IndexView,
    LagView,
    NotLeader,
    Page,
    PartitionRow,
    SidecarLoad,
)
from services.runtime.lag import Status
from services.runtime.topic_partition import TopicPartition
from tests.support.ui_html import EVIL, parse, with_attr

TP = TopicPartition("orders", 0)
PAGE = Page(instance="10.0.0.1:7070", generated_at="2025-01-01T00:00:00Z")


# ---- history -------------------------------------------------------------------------


def test_history_keeps_the_last_points_as_the_trend() -> None:
    history = LagHistory(points=3)
    for i, lag in enumerate([5, 7, 9, 11]):
        history.add("g", TP, committed=100, end=100 + lag, lag=lag, now_s=float(i))
    assert history.trend("g", TP) == [7, 9, 11]
    assert history.trend("g", TopicPartition("orders", 1)) == []
    assert history.trend("other", TP) == []


def test_unknown_partition_is_notfound_and_caught_up_is_ok() -> None:
    history = LagHistory(intervals=4, min_complete=0.5)
    assert history.status("g", TP, 0.0) is Status.NOTFOUND
    for i in range(6):
        history.add("g", TP, committed=10 * i, end=10 * i, lag=0, now_s=float(i))
    assert history.status("g", TP, 6.0) is Status.OK


def test_committed_offset_that_does_not_move_with_lag_is_stall() -> None:
    history = LagHistory(intervals=4, min_complete=0.5)
    for i in range(5):
        history.add("g", TP, committed=50, end=80 + i, lag=30 + i, now_s=float(i))
    assert history.status("g", TP, 5.0) is Status.STALL


def test_consumer_progressing_but_falling_behind_is_warn() -> None:
    history = LagHistory(intervals=4, min_complete=0.5)
    for i in range(5):
        committed = 10 * i
        end = 20 * i + 5
        history.add("g", TP, committed, end, lag=end - committed, now_s=float(i))
    assert history.status("g", TP, 5.0) is Status.WARN


def test_window_not_judged_before_min_complete() -> None:
    history = LagHistory(intervals=10, min_complete=0.5)
    for i in range(3):
        history.add("g", TP, committed=50, end=90, lag=40, now_s=float(i))
    assert history.status("g", TP, 3.0) is Status.OK


def test_retain_forgets_groups_no_longer_served() -> None:
    history = LagHistory()
    history.add("a", TP, 1, 2, 1, 0.0)
    history.add("b", TP, 1, 2, 1, 0.0)
    history.retain({"b"})
    assert history.trend("a", TP) == []
    assert history.trend("b", TP) == [1]


@given(st.lists(st.integers(min_value=0, max_value=10**9), max_size=200))
def test_trend_is_a_bounded_suffix_of_the_samples(lags: list[int]) -> None:
    history = LagHistory(points=16)
    for i, lag in enumerate(lags):
        history.add("g", TP, committed=0, end=lag, lag=lag, now_s=float(i))
    assert history.trend("g", TP) == lags[-16:]


# ---- charts --------------------------------------------------------------------------


def test_sparkline_scales_into_its_box_and_marks_the_last_point() -> None:
    svg = sparkline_svg([0, 5, 10], width=100, height=20, label="lag")
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None
    coords = [tuple(map(float, p.split(","))) for p in points.group(1).split()]
    assert coords == [(2.0, 18.0), (50.0, 10.0), (98.0, 2.0)]
    assert '<circle cx="98" cy="2"' in svg
    assert "<title>lag</title>" in svg


def test_sparkline_of_nothing_is_a_flat_dash() -> None:
    svg = sparkline_svg([], width=100, height=20)
    assert "<polyline" not in svg and '<line x1="0" y1="10"' in svg


@given(st.lists(st.floats(min_value=0, max_value=1e12), min_size=1, max_size=100))
def test_sparkline_points_stay_inside_the_box(values: list[float]) -> None:
    svg = sparkline_svg(values, width=120, height=24)
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None
    for pair in points.group(1).split():
        x, y = map(float, pair.split(","))
        assert 0 <= x <= 120 and 0 <= y <= 24


def test_bar_chart_bars_are_proportional_and_labelled() -> None:
    svg = bar_chart_svg([("a", 2.0), ("b", 4.0)], chart_id="c")
    bars = with_attr(svg, "data-value")
    assert [(b["data-label"], b["data-value"]) for b in bars] == [("a", "2"), ("b", "4")]
    widths = [float(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="([\d.]+)"', svg)]
    assert widths[1] == 2 * widths[0] > 0


def test_bar_chart_escapes_labels() -> None:
    svg = bar_chart_svg([(EVIL, 1.0)])
    assert "<script>" not in svg and "&lt;script&gt;" in svg


# ---- pages ---------------------------------------------------------------------------


def row(partition: int, **kw: object) -> PartitionRow:
    base: dict[str, object] = dict(
        topic="orders", partition=partition, holder="sc-a", epoch=3, state="granted",
        committed=40, end=52, lag_records=12, lag_seconds=1.5, status="OK",
        trend=(3, 8, 12), bytes_per_second=2048.0,
    )  # fmt: skip
    base.update(kw)
    return PartitionRow(**base)  # type: ignore[arg-type]


def lag_view(**kw: object) -> LagView:
    base: dict[str, object] = dict(
        page=PAGE, group="g1", status="WARN",
        partitions=(row(0), row(1, committed=-1, lag_records=52, lag_seconds=-1.0)),
        bindings=(BindingRow("client-1", ("sc-a@h:1", "sc-b@h:2")),),
        faults=Faults(rows=(FaultRow("t", "CONSUMER_LOST", "OPEN", "ERROR", "assigner", "m"),)),
        sample_seconds=5.0,
    )  # fmt: skip
    base.update(kw)
    return LagView(**base)  # type: ignore[arg-type]


def test_every_page_refreshes_itself_and_loads_nothing_external() -> None:
    pages = [
        render.render_index(IndexView(PAGE, ())),
        render.render_lag(lag_view()),
        render.render_distribution(DistributionView(PAGE, ())),
        render.render_not_leader(NotLeader(PAGE, "10.0.0.2:7070", None)),
    ]
    for html in pages:
        assert '<meta http-equiv="refresh" content="5">' in html
        tags = parse(html).tags
        assert not [t for t, _ in tags if t == "script"]
        assert not [a for _, a in tags if (a.get("src") or "").startswith("http")]
        assert not [a for t, a in tags if t == "link" or (a.get("href") or "").startswith("http")]


def test_lag_page_rows_carry_the_figures() -> None:
    html = render.render_lag(lag_view())
    rows = {a["data-partition"]: a for a in with_attr(html, "data-partition")}
    assert set(rows) == {"orders/0", "orders/1"}
    assert rows["orders/0"]["data-committed"] == "40"
    assert rows["orders/0"]["data-end"] == "52"
    assert rows["orders/0"]["data-lag"] == "12"
    assert rows["orders/0"]["data-status"] == "OK"
    assert rows["orders/1"]["data-committed"] == "-1"
    assert rows["orders/1"]["data-lag-seconds"] == "-1.000"
    (section,) = with_attr(html, "data-total-lag")
    assert section["data-total-lag"] == "64" and section["data-status"] == "WARN"
    text = "".join(parse(html).text)
    assert "unknown" in text and "none" in text  # -1 values shown in words
    assert "2.0 KiB/s" in text
    assert with_attr(html, "data-client")[0]["data-sidecars"] == "2"
    assert with_attr(html, "data-fault-type")[0]["data-fault-type"] == "CONSUMER_LOST"
    assert html.count('<svg class="spark"') == 2


def test_lag_page_says_when_the_notifier_is_not_configured() -> None:
    html = render.render_lag(lag_view(faults=Faults(note="notifier not configured")))
    (note,) = [a for _, a in parse(html).tags if a.get("id") == "faults-note"]
    assert note is not None and "notifier not configured" in html


def test_every_mesh_string_is_escaped() -> None:
    html = render.render_lag(
        lag_view(
            group=EVIL,
            partitions=(row(0, topic=EVIL, holder=EVIL),),
            bindings=(BindingRow(EVIL, (EVIL,)),),
            faults=Faults(rows=(FaultRow(EVIL, EVIL, EVIL, EVIL, EVIL, EVIL),)),
        )
    )
    assert "<script>" not in html
    assert not [t for t, _ in parse(html).tags if t == "script"]
    index = render.render_index(
        IndexView(PAGE, (GroupSummary(EVIL, "leased", "count", 1, 2, 0, 5),))
    )
    assert "<script>" not in index
    assert "/ui/lag?group=%3Cscript%3E" in index  # the link's query is URL-encoded


def test_distribution_page_shows_sidecars_brokers_and_imbalance() -> None:
    group = GroupDistribution(
        name="g1", mode="leased", strategy="count",
        sidecars=(
            SidecarLoad("sc-a", "h:1", "", ("t/0", "t/1", "t/2"), 4096.0),
            SidecarLoad("sc-b", "h:2", "z1", ("t/3",), 0.0),
        ),
        brokers=(
            BrokerLoad(1, "b1:9092", ("t/0", "t/2")),
            BrokerLoad(2, "b2:9092", ("t/1", "t/3")),
        ),
        unassigned=("t/4",), imbalance=1.5,
    )  # fmt: skip
    html = render.render_distribution(DistributionView(PAGE, (group,)))
    sidecars = {a["data-sidecar"]: a for a in with_attr(html, "data-sidecar")}
    assert sidecars["sc-a"]["data-partitions"] == "3"
    assert sidecars["sc-a"]["data-partition-list"] == "t/0 t/1 t/2"
    assert sidecars["sc-a"]["data-bytes-per-second"] == "4096.0"
    brokers = {a["data-broker"]: a["data-partitions"] for a in with_attr(html, "data-broker")}
    assert brokers == {"1": "2", "2": "2"}
    (section,) = with_attr(html, "data-imbalance")
    assert section["data-imbalance"] == "1.500"
    assert with_attr(html, "data-unassigned")[0]["data-unassigned"] == "1"
    charts = [a["id"] for t, a in parse(html).tags if t == "svg" and a.get("id")]
    assert charts == ["chart-sidecars-g1", "chart-rate-g1", "chart-brokers-g1"]


def test_follower_page_links_to_the_leader() -> None:
    html = render.render_not_leader(NotLeader(PAGE, "10.0.0.2:7070", "http://10.0.0.2:7071/ui"))
    (leader,) = [a for _, a in parse(html).tags if a.get("id") == "leader"]
    assert leader["href"] == "http://10.0.0.2:7071/ui"
    assert leader["data-leader"] == "10.0.0.2:7070"
    unknown = render.render_not_leader(NotLeader(PAGE, None, None))
    assert "No assigner leads right now" in unknown


def test_index_lists_groups_with_links() -> None:
    html = render.render_index(
        IndexView(PAGE, (GroupSummary("g1", "leased", "count", 2, 6, 1, -1),), "Kafka down")
    )
    (group,) = with_attr(html, "data-group")
    assert group["data-partitions"] == "6" and group["data-lag"] == "-1"
    assert 'href="/ui/lag?group=g1"' in html and "Kafka down" in html
