"""Pages as HTML strings (pure: data from :mod:`.model` in, text out).

Plain server-rendered HTML: inline CSS and SVG, a ``<meta http-equiv="refresh">`` so the
page follows the mesh by itself, no script and no external asset. Every string that
comes from the mesh (group, topic, sidecar and client ids, fault messages) is escaped.
Rows and figures carry stable ``id``s and ``data-*`` attributes (``data-partition=
"topic/3" data-lag="12"``) for tests and scrapers.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from services.assigner.client_activity import ClientRow
from services.assigner.ui.charts import bar_chart_svg, sparkline_svg
from services.assigner.ui.model import (
    ClientsView,
    DistributionView,
    Faults,
    GroupDistribution,
    IndexView,
    LagView,
    NotLeader,
    Page,
    PartitionRow,
    Problem,
)

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:baseline}
header a{color:#cfe3ff;text-decoration:none}header h1{font-size:16px;margin:0 12px 0 0}
main{padding:12px 16px}section{background:#fff;border:1px solid #dde1e7;border-radius:6px;
padding:10px 14px;margin-bottom:14px}h2{font-size:15px;margin:4px 0 8px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 8px;
border-bottom:1px solid #eef0f3;vertical-align:middle}th{font-weight:600;color:#55606e}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#7a8594;fill:#7a8594}.bars rect{fill:#3f7fd8}.bars text{font-size:12px}
.spark{color:#3f7fd8}.status{padding:1px 6px;border-radius:3px;font-size:12px}
.s-OK{background:#e3f4e8;color:#1c6b35}.s-WARN{background:#fff3d6;color:#7a5300}
.s-ERR,.s-STOP,.s-STALL,.s-REWIND{background:#fde2e2;color:#9b1c1c}
.s-NOTFOUND{background:#eef0f3;color:#55606e}.kv{display:flex;gap:24px;flex-wrap:wrap}
.kv div b{display:block;font-size:18px}footer{color:#7a8594;padding:0 16px 16px}
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _q(value: str) -> str:
    return quote(value, safe="")


def _fmt_rate(bytes_per_second: float) -> str:
    for unit, size in (("MiB/s", 1 << 20), ("KiB/s", 1 << 10)):
        if bytes_per_second >= size:
            return f"{bytes_per_second / size:.1f} {unit}"
    return f"{bytes_per_second:.0f} B/s"


def _fmt_seconds(seconds: float) -> str:
    if seconds < 0:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# What a badge says where Burrow's own word would puzzle an operator; the title keeps
# Burrow's status name (and data-status, for scripts, stays Burrow's).
_STATUS_LABELS = {"NOTFOUND": "no commit yet"}


def _status(status: str) -> str:
    label = _STATUS_LABELS.get(status, status)
    return f'<span class="status s-{_e(status)}" title="{_e(status)}">{_e(label)}</span>'


def layout(page: Page, title: str, body: str, *, refresh: bool = True) -> str:
    meta = f'<meta http-equiv="refresh" content="{page.refresh_seconds}">' if refresh else ""
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{meta}'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)} · ds-assigner</title><style>{_CSS}</style></head>"
        f'<body><header><h1>ds-assigner</h1><a href="/ui">groups</a>'
        f'<a href="/ui/distribution">distribution</a><a href="/ui/clients">clients</a>'
        f'<a href="/metrics">metrics</a>'
        f'<span class="muted">{_e(title)}</span></header><main>{body}</main>'
        f'<footer id="footer" data-instance="{_e(page.instance)}" '
        f'data-generated-at="{_e(page.generated_at)}">served by {_e(page.instance)} at '
        f"{_e(page.generated_at)}; refreshes every {page.refresh_seconds} s</footer>"
        "</body></html>\n"
    )


# ---- pages ---------------------------------------------------------------------------


def render_index(view: IndexView) -> str:
    rows = []
    for g in view.groups:
        lag = "unknown" if g.total_lag < 0 else str(g.total_lag)
        rows.append(
            f'<tr id="group-{_e(g.name)}" data-group="{_e(g.name)}" '
            f'data-sidecars="{g.sidecars}" data-partitions="{g.partitions}" '
            f'data-lag="{g.total_lag}"><td><a href="/ui/lag?group={_q(g.name)}">'
            f"{_e(g.name)}</a></td><td>{_e(g.mode)}</td><td>{_e(g.strategy)}</td>"
            f'<td class="num">{g.sidecars}</td><td class="num">{g.partitions}</td>'
            f'<td class="num">{g.clients}</td><td class="num">{_e(lag)}</td></tr>'
        )
    table = (
        "<table><thead><tr><th>group</th><th>mode</th><th>balance</th>"
        '<th class="num">sidecars</th><th class="num">partitions</th>'
        '<th class="num">clients</th><th class="num">lag (records)</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="muted">No group yet (dsctl or AdminService.CreateGroup creates one).</p>'
    )
    error = f'<p class="muted" id="error">{_e(view.error)}</p>' if view.error else ""
    body = f'<section id="groups"><h2>Groups</h2>{table}{error}</section>'
    return layout(view.page, "groups", body)


def _distribution_group(g: GroupDistribution) -> str:
    gid = _e(g.name)
    sidecar_rows = "".join(
        f'<tr data-group="{gid}" data-sidecar="{_e(s.sidecar_id)}" '
        f'data-partitions="{len(s.partitions)}" '
        f'data-partition-list="{_e(" ".join(s.partitions))}" '
        f'data-bytes-per-second="{s.bytes_per_second:.1f}"><td>{_e(s.sidecar_id)}</td>'
        f"<td>{_e(s.endpoint)}</td><td>{_e(s.zone or '-')}</td>"
        f'<td class="num">{len(s.partitions)}</td>'
        f'<td class="num">{_e(_fmt_rate(s.bytes_per_second))}</td>'
        f"<td>{_e(', '.join(s.partitions)) or '-'}</td></tr>"
        for s in g.sidecars
    )
    broker_rows = "".join(
        f'<tr data-group="{gid}" data-broker="{b.broker_id}" '
        f'data-partitions="{len(b.partitions)}"><td>{b.broker_id}</td><td>{_e(b.host)}</td>'
        f'<td class="num">{len(b.partitions)}</td><td>{_e(", ".join(b.partitions))}</td></tr>'
        for b in g.brokers
    )
    unassigned = (
        f'<p id="unassigned-{gid}" data-unassigned="{len(g.unassigned)}">Not held by any '
        f"sidecar right now: {_e(', '.join(g.unassigned))}</p>"
        if g.unassigned
        else ""
    )
    by_sidecar = bar_chart_svg(
        [(s.sidecar_id, float(len(s.partitions))) for s in g.sidecars],
        chart_id=f"chart-sidecars-{g.name}",
    )
    by_rate = bar_chart_svg(
        [(s.sidecar_id, s.bytes_per_second / 1024) for s in g.sidecars],
        unit=" KiB/s",
        chart_id=f"chart-rate-{g.name}",
    )
    by_broker = bar_chart_svg(
        [(f"broker {b.broker_id}", float(len(b.partitions))) for b in g.brokers],
        chart_id=f"chart-brokers-{g.name}",
    )
    return (
        f'<section id="dist-{gid}" data-group="{gid}" data-imbalance="{g.imbalance:.3f}">'
        f'<h2>{gid} <a class="muted" href="/ui/lag?group={_q(g.name)}">lag →</a></h2>'
        f'<div class="kv"><div><b id="imbalance-{gid}">{g.imbalance:.2f}</b>imbalance '
        f"(max/mean partitions)</div><div><b>{len(g.sidecars)}</b>sidecars</div>"
        f"<div><b>{sum(len(s.partitions) for s in g.sidecars) + len(g.unassigned)}</b>"
        f"partitions</div><div><b>{_e(g.mode)}</b>mode, {_e(g.strategy)} balance</div></div>"
        f"<h3>Partitions per sidecar</h3>{by_sidecar}"
        f"<h3>Bytes/s per sidecar</h3>{by_rate}"
        '<table class="sidecars"><thead><tr><th>sidecar</th><th>endpoint</th><th>zone</th>'
        '<th class="num">partitions</th><th class="num">fetch rate</th><th>leases</th></tr>'
        f"</thead><tbody>{sidecar_rows}</tbody></table>{unassigned}"
        f"<h3>Partitions per broker (partition leader)</h3>{by_broker}"
        '<table class="brokers"><thead><tr><th>broker</th><th>host</th>'
        '<th class="num">partitions led</th><th>partitions</th></tr></thead>'
        f"<tbody>{broker_rows}</tbody></table></section>"
    )


def render_distribution(view: DistributionView) -> str:
    sections = "".join(_distribution_group(g) for g in view.groups)
    if not sections:
        sections = '<section><p class="muted">No group yet.</p></section>'
    error = (
        f'<section><p class="muted" id="broker-error">Broker view unavailable: '
        f"{_e(view.broker_error)}</p></section>"
        if view.broker_error
        else ""
    )
    return layout(view.page, "distribution", error + sections)


def _partition_row(p: PartitionRow) -> str:
    committed = "none" if p.committed < 0 else str(p.committed)
    return (
        f'<tr id="p-{_e(p.key)}" data-partition="{_e(p.key)}" data-holder="{_e(p.holder)}" '
        f'data-committed="{p.committed}" data-end="{p.end}" data-lag="{p.lag_records}" '
        f'data-lag-seconds="{p.lag_seconds:.3f}" data-status="{_e(p.status)}" '
        f'data-committed-by="{_e(p.committed_by)}">'
        f'<td>{_e(p.topic)}</td><td class="num">{p.partition}</td>'
        f'<td>{_e(p.holder or "-")}</td><td>{_e(p.state)}</td><td class="num">{p.epoch}</td>'
        f'<td class="num">{_e(committed)}</td><td>{_e(p.committed_by or "-")}</td>'
        f'<td class="num">{p.end}</td><td class="num">{p.lag_records}</td>'
        f'<td class="num">{_e(_fmt_seconds(p.lag_seconds))}</td>'
        f"<td>{_status(p.status)}</td>"
        f"<td>{sparkline_svg(p.trend, label=f'lag of {p.key}, last {len(p.trend)} samples')}</td>"
        f'<td class="num">{_e(_fmt_rate(p.bytes_per_second))}</td></tr>'
    )


def _faults(faults: Faults) -> str:
    if faults.note:
        return f'<p class="muted" id="faults-note">{_e(faults.note)}</p>'
    if not faults.rows:
        return '<p class="muted" id="faults-note">No fault recorded for this group.</p>'
    rows = "".join(
        f'<tr data-fault-type="{_e(f.type)}" data-fault-state="{_e(f.state)}">'
        f"<td>{_e(f.detected_at)}</td><td>{_e(f.type)}</td><td>{_e(f.state)}</td>"
        f"<td>{_e(f.severity)}</td><td>{_e(f.source)}</td><td>{_e(f.message)}</td></tr>"
        for f in faults.rows
    )
    return (
        "<table><thead><tr><th>detected</th><th>type</th><th>state</th><th>severity</th>"
        f"<th>source</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def render_lag(view: LagView) -> str:
    gid = _e(view.group)
    rows = "".join(_partition_row(p) for p in view.partitions)
    bindings = "".join(
        f'<tr data-client="{_e(b.client_id)}" data-sidecars="{len(b.sidecars)}">'
        f"<td>{_e(b.client_id)}</td><td>{_e(', '.join(b.sidecars)) or '-'}</td></tr>"
        for b in view.bindings
    )
    bindings_table = (
        "<table><thead><tr><th>client</th><th>bound to</th></tr></thead>"
        f"<tbody>{bindings}</tbody></table>"
        if bindings
        else '<p class="muted">No client bound.</p>'
    )
    body = (
        f'<section id="lag" data-group="{gid}" data-total-lag="{view.total_lag}" '
        f'data-status="{_e(view.status)}"><h2>Lag of {gid} {_status(view.status)}</h2>'
        f'<div class="kv"><div><b id="total-lag">{view.total_lag}</b>records behind</div>'
        f"<div><b>{len(view.partitions)}</b>partitions</div>"
        f"<div><b>{view.sample_seconds:g} s</b>between trend samples</div></div>"
        '<table class="partitions"><thead><tr><th>topic</th><th class="num">partition</th>'
        '<th>holder</th><th>lease</th><th class="num">epoch</th>'
        '<th class="num">committed</th><th>committed by</th><th class="num">end</th>'
        '<th class="num">lag</th><th class="num">lag time</th><th>status</th><th>trend</th>'
        f'<th class="num">fetch rate</th></tr></thead><tbody>{rows}</tbody></table></section>'
        f'<section id="bindings"><h2>Bindings <a class="muted" '
        f'href="/ui/clients?group={_q(view.group)}">clients →</a></h2>{bindings_table}</section>'
        f'<section id="faults"><h2>Recent faults</h2>{_faults(view.faults)}</section>'
    )
    return layout(view.page, f"lag of {view.group}", body)


def _ago(seconds_since_epoch: float, now: float) -> str:
    if seconds_since_epoch <= 0:
        return "-"
    return f"{_fmt_seconds(max(0.0, now - seconds_since_epoch))} ago"


def _client_row(c: ClientRow, now: float) -> str:
    sidecars = " ".join(s.sidecar_id for s in c.sidecars)
    per_sidecar = "<br>".join(
        f'{_e(s.sidecar_id)} <span class="muted">{_e(s.endpoint)}</span> '
        f"{s.rates.records:.1f} rec/s"
        for s in c.sidecars
    )
    return (
        f'<tr data-group="{_e(c.group)}" data-client="{_e(c.client_id)}" '
        f'data-sidecars="{_e(sidecars)}" data-records-per-second="{c.rates.records:.3f}" '
        f'data-acks-per-second="{c.rates.acks:.3f}" '
        f'data-errors-per-second="{c.rates.errors:.3f}" data-bound="{str(c.bound).lower()}">'
        f'<td><a href="/ui/lag?group={_q(c.group)}">{_e(c.group)}</a></td>'
        f"<td>{_e(c.client_id)}</td><td>{per_sidecar or '-'}</td>"
        f'<td class="num">{c.rates.records:.1f}</td><td class="num">{c.rates.acks:.1f}</td>'
        f'<td class="num">{c.rates.errors:.1f}</td>'
        f'<td class="num">{100 * c.error_ratio:.1f}</td>'
        f"<td>{_ago(c.last_seen, now)}</td>"
        f"<td>{_ago(c.bound_since, now) if c.bound else 'not bound'}</td></tr>"
    )


def render_clients(view: ClientsView) -> str:
    rows = "".join(_client_row(c, view.now) for c in view.clients)
    table = (
        "<table><thead><tr><th>group</th><th>client</th><th>sidecars</th>"
        '<th class="num">records/s</th><th class="num">acks/s</th>'
        '<th class="num">errors/s</th><th class="num">error %</th><th>last seen</th>'
        f"<th>bound since</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else '<p class="muted">No client bound or seen.</p>'
    )
    scope = f"clients of {view.group}" if view.group else "clients"
    body = (
        f'<section id="clients" data-group="{_e(view.group)}" data-count="{len(view.clients)}">'
        f"<h2>{_e(scope.capitalize())}</h2>{table}"
        '<p class="muted">Rates over the sidecars\' last heartbeats (about 10 s).</p></section>'
    )
    return layout(view.page, scope, body)


def render_not_leader(view: NotLeader) -> str:
    if view.leader_address is None:
        text = "No assigner leads right now (an election is in progress)."
    elif view.leader_ui:
        text = (
            f'This replica follows. The leader is <a id="leader" href="{_e(view.leader_ui)}" '
            f'data-leader="{_e(view.leader_address)}">{_e(view.leader_address)}</a>.'
        )
    else:
        text = (
            f'This replica follows. The leader is <span id="leader" '
            f'data-leader="{_e(view.leader_address)}">{_e(view.leader_address)}</span> '
            "(gRPC); its views are at /ui on its HTTP port."
        )
    body = f'<section id="not-leader"><h2>Not the leader</h2><p>{text}</p></section>'
    return layout(view.page, "follower", body)


def render_problem(view: Problem) -> str:
    body = (
        f'<section id="problem" data-status="{view.status}"><h2>{_e(view.title)}</h2>'
        f"<p>{_e(view.detail)}</p></section>"
    )
    return layout(view.page, view.title, body)
