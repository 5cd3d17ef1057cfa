"""deploy/ checked with the real tools: promtool (configs, rules, rule unit tests), amtool
(Alertmanager config and routes), and the Grafana dashboards' PromQL — every expression
parses (they are written as recording rules and given to ``promtool check rules``) and
names only metrics the services declare or the recording rules define."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import prom

pytestmark = [pytest.mark.integration]

SERVICES = prom.REPO / "services"
DECLARED = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|"
    r"HistogramMetricFamily|SummaryMetricFamily)\(\s*\"(ds_[a-z0-9_]+)\""
)
SPEC = re.compile(r"_spec\(\s*\"(ds_[a-z0-9_]+)\",\s*\"(counter|gauge|histogram|summary)\"")
METRIC_TOKEN = re.compile(r"(?<![\w:\"])(ds_[a-z0-9_]+|ds:[a-z0-9_:]+)(?![\w\"])")
# Prometheus' own series the rules may use.
BUILTIN = {"up"}
KAFKA_TOKEN = re.compile(r"(?<![\w:\"])(kafka_[a-z0-9_]+)(?![\w\"])")
JMX_EXPORTER_RULES = prom.REPO / "deploy" / "kafka" / "jmx-exporter.yml"
# The broker dashboard: brokers have no consumer groups, it selects brokers instead.
BROKER_BOARDS = {"kafka-brokers"}


def _exposed(name: str, kind: str) -> set[str]:
    """The sample names a metric of ``kind`` declared as ``name`` is exposed under."""
    kind = kind.lower().removesuffix("metricfamily")
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


def exported_metric_names() -> set[str]:
    """Every ds_* sample name the services' sources declare."""
    names: set[str] = set()
    for path in SERVICES.rglob("*.py"):
        text = path.read_text()
        for kind, name in DECLARED.findall(text):
            names |= _exposed(name, kind)
        for name, kind in SPEC.findall(text):  # the sidecar's metric table
            names |= _exposed(name, kind)
    return names


def recorded_names() -> set[str]:
    names = set()
    for path in prom.rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def alert_rules() -> list[dict[str, Any]]:
    rules = []
    for path in prom.rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules += [r for r in group["rules"] if "alert" in r]
    return rules


def rule_exprs() -> list[str]:
    return [
        r["expr"]
        for path in prom.rule_files()
        for group in yaml.safe_load(path.read_text())["groups"]
        for r in group["rules"]
    ]


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(prom.DASHBOARDS_DIR.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) of every query of every panel."""
    return [
        (name, panel["title"], target["expr"])
        for name, board in dashboards().items()
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def as_plain_promql(expr: str) -> str:
    """A Grafana query with its variables replaced by what they expand to."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    expr = expr.replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    # Label values ("...") are not metric names: drop quoted strings first.
    return set(METRIC_TOKEN.findall(re.sub(r'"[^"]*"', '""', expr)))


def test_configs_pass_promtool_check_config() -> None:
    for name in ("prometheus.yml", "prometheus-static.yml"):
        result = prom.check_config(prom.PROMETHEUS_DIR / name)
        assert result.ok, result.output
        assert "SUCCESS: 2 rule files found" in result.output, result.output
        if result.note:
            print(result.note)


def test_consul_config_scrapes_the_registered_metrics_port() -> None:
    """The relabelling reads the meta key services/runtime/lifecycle.py registers."""
    config = yaml.safe_load((prom.PROMETHEUS_DIR / "prometheus.yml").read_text())
    (scrape,) = [s for s in config["scrape_configs"] if "consul_sd_configs" in s]
    services = scrape["consul_sd_configs"][0]["services"]
    assert services == ["ds-assigner", "ds-sidecar", "ds-notifier"]
    sources = {label for r in scrape["relabel_configs"] for label in r.get("source_labels", [])}
    assert "__meta_consul_service_metadata_http_port" in sources
    lifecycle = (SERVICES / "runtime" / "lifecycle.py").read_text()
    assert 'meta={"http_port": str(self.http.port)' in lifecycle
    names = {
        re.search(r'name = "(ds-[a-z]+)"', (SERVICES / d / "app.py").read_text()).group(1)  # type: ignore[union-attr]
        for d in ("assigner", "consumer_sidecar", "notifier")
    }
    assert names == set(services)


def test_rules_pass_promtool_check_and_unit_tests() -> None:
    checked = prom.run_tool(prom.PROMTOOL_BIN, "check", "rules", *map(str, prom.rule_files()))
    assert checked.ok, checked.output
    tested = prom.run_tool(
        prom.PROMTOOL_BIN, "test", "rules", *map(str, sorted(prom.RULE_TESTS_DIR.glob("*.yml")))
    )
    assert tested.ok, tested.output
    assert tested.output.count("SUCCESS") == len(list(prom.RULE_TESTS_DIR.glob("*.yml")))


def test_every_alert_is_complete_and_unit_tested_both_ways() -> None:
    cases: dict[str, dict[str, int]] = {}
    for path in prom.RULE_TESTS_DIR.glob("*.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test.get("alert_rule_test", []):
                kind = "fires" if check.get("exp_alerts") else "silent"
                counts = cases.setdefault(check["alertname"], {"fires": 0, "silent": 0})
                counts[kind] += 1
    rules = alert_rules()
    assert len(rules) >= 15
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"Ds[A-Z][A-Za-z]+", name), name
        assert rule.get("for"), f"{name} has no for:"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert set(rule["annotations"]) >= {"summary", "description", "runbook"}, name
        assert cases.get(name, {}).get("fires"), f"{name}: no promtool case where it fires"
        assert cases.get(name, {}).get("silent"), f"{name}: no promtool case where it is silent"


def test_alertmanager_config_and_routes() -> None:
    config = str(prom.ALERTMANAGER_CONFIG)
    checked = prom.run_tool(prom.AMTOOL_BIN, "check-config", config)
    assert checked.ok, checked.output
    expected = {
        ("group=orders-eu", "severity=warning"): "orders-team",
        ("group=orders-eu", "severity=critical"): "orders-pager",
        ("group=payments-ledger", "severity=warning"): "payments-team",
        ("group=unclaimed", "severity=warning"): "platform-oncall",
        ("alertname=DsAssignerNoLeader", "severity=critical"): "platform-pager",
    }
    for labels, receiver in expected.items():
        routed = prom.run_tool(
            prom.AMTOOL_BIN, "config", "routes", "test", f"--config.file={config}", *labels
        )
        assert routed.ok, routed.output
        assert routed.output.splitlines()[0].strip() == receiver, (labels, routed.output)


def test_dashboards_are_grafana_json_with_the_shared_variables() -> None:
    boards = dashboards()
    assert set(boards) == {"distribution", "lag", "clients", "sidecar", "kafka-brokers"}
    uids = set()
    for name, board in boards.items():
        assert board["schemaVersion"] >= 36, name
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["DS_PROMETHEUS"]["type"] == "datasource", name
        selector = "instance" if name in BROKER_BOARDS else "group"
        assert variables[selector]["type"] == "query", name
        queried = [p for p in panels(board) if p["type"] != "row"]
        assert len(queried) >= 8, name
        for panel in queried:
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
    assert len(uids) == len(boards)


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": as_plain_promql(expr)}
        for i, (_board, _title, expr) in enumerate(exprs)
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = prom.run_tool(prom.PROMTOOL_BIN, "check", "rules", str(path))
    assert result.ok, result.output
    assert f"SUCCESS: {len(exprs)} rules found" in result.output


def test_rules_and_dashboards_name_only_exported_or_recorded_metrics() -> None:
    known = exported_metric_names() | recorded_names() | BUILTIN
    assert "ds_group_lag_records" in known  # the scan itself works
    missing: dict[str, set[str]] = {}
    sources = [("rules", expr) for expr in rule_exprs()]
    sources += [(f"{board}: {title}", expr) for board, title, expr in dashboard_exprs()]
    for where, expr in sources:
        unknown = metric_names(expr) - known
        if unknown:
            missing.setdefault(where, set()).update(unknown)
    assert not missing, f"metrics no service declares: {missing}"


def test_rules_and_dashboards_name_only_kafka_metrics_the_jmx_exporter_defines() -> None:
    """The broker's kafka_* names exist only through deploy/kafka/jmx-exporter.yml."""
    defined = {rule["name"] for rule in yaml.safe_load(JMX_EXPORTER_RULES.read_text())["rules"]}
    sources = [("rules", expr) for expr in rule_exprs()]
    sources += [(f"{board}: {title}", expr) for board, title, expr in dashboard_exprs()]
    used: set[str] = set()
    missing: dict[str, set[str]] = {}
    for where, expr in sources:
        names = set(KAFKA_TOKEN.findall(re.sub(r'"[^"]*"', '""', expr)))
        used |= names
        if names - defined:
            missing.setdefault(where, set()).update(names - defined)
    assert not missing, f"kafka metrics the JMX exporter rules do not define: {missing}"
    assert "kafka_server_under_replicated_partitions" in used  # the scan itself works
