"""Alerting end to end on the real stack (issue 6 acceptance): a real Prometheus (Debian
package) scrapes the assigner, a sidecar and the notifier; a group is made to lag; the
repo's lag alert fires in Prometheus, reaches a real Alertmanager routed by the repo's
config to the group owner's receiver, and is posted to that receiver's webhook.

The repo's rules have production ``for:`` durations (minutes): the test evaluates a copy
of deploy/prometheus/rules/*.yml whose every ``for:`` is 2s (tests/support/prom.py
``fast_rule_files``); thresholds and expressions are the repo's. Likewise Alertmanager
runs the repo's routes, receivers and inhibit rules with ``group_wait`` shortened and the
webhook URLs pointed at the test's sink.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dsclient import DsClient
from tests.support import prom
from tests.support.alerting import alertmanager_config
from tests.support.mesh import Mesh
from tests.support.notifier import notifier_config, start_notifier
from tests.support.walking_skeleton import committed_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 12  # as produce() of the walking skeleton
FIRST = 48  # consumed and acked: the group has committed once, so the notifier tracks it
BACKLOG = 12_000  # produced afterwards and never consumed: above DsGroupLagRecordsHigh's 10000
ALERT = "DsGroupLagRecordsHigh"


def consume_and_ack(client: DsClient, count: int, timeout: float = 90) -> int:
    acked = 0
    deadline = time.monotonic() + timeout
    while acked < count and time.monotonic() < deadline:
        batch = client.fetch(max_records=500, max_wait=1.0)
        if batch:
            acked += client.ack(batch)
    return acked


def test_lag_alert_reaches_alertmanager_and_the_owners_webhook(
    mesh: Mesh, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    # "orders-" groups belong to the orders team in deploy/alertmanager/alertmanager.yml.
    group = f"orders-e2e-{uuid.uuid4().hex[:8]}"
    config = notifier_config(
        tmp_path / "notifier.yaml",
        # Fast evaluation; a window too long to fill during the test keeps Burrow's STOP
        # (a critical alert that would inhibit the warning under test) out of the way.
        lag={
            "poll_seconds": 1.0,
            "evaluate_seconds": 1.0,
            "intervals": 1000,
            "group_include": f"^{group}$",
        },
    )
    notifier = start_notifier(mesh, tmp_path / "outbox.sqlite", config)
    assigner = mesh.assigner([(group, [topic])])
    sidecar = mesh.sidecar(group, assigner, "sidecar-alerting")
    for svc in (notifier, assigner, sidecar):
        svc.wait_serving(90)

    # The group consumes a little and commits it, then falls BACKLOG records behind.
    produce(mesh.bootstrap, topic, FIRST)
    with DsClient(group, client_id="orders-app", assigner=assigner.grpc_addr) as client:
        assert consume_and_ack(client, FIRST) == FIRST
        prom.wait_until(
            lambda: sum(committed_offsets(mesh.bootstrap, group, topic).values()) == FIRST,
            60,
            "the acked records to be committed",
        )
    produce(mesh.bootstrap, topic, BACKLOG)

    with prom.WebhookSink() as sink:
        alertmanager = prom.Alertmanager(alertmanager_config(sink), tmp_path / "alertmanager")
        prometheus: prom.Prometheus | None = None
        try:
            alertmanager.start()
            jobs = {
                "ds-assigner": [f"127.0.0.1:{assigner.http_port}"],
                "ds-sidecar": [f"127.0.0.1:{sidecar.http_port}"],
                "ds-notifier": [f"127.0.0.1:{notifier.http_port}"],
            }
            rules = prom.fast_rule_files(tmp_path / "rules", "2s")
            prometheus = prom.Prometheus(
                prom.test_prometheus_config(jobs, rules, alertmanager.address),
                tmp_path / "prometheus",
            )
            prometheus.start()

            # Prometheus scrapes every service of the mesh.
            targets = prom.wait_until(
                lambda: (
                    (t := prometheus.targets())
                    and len(t) == 3
                    and all(x["health"] == "up" for x in t)
                    and t
                ),
                60,
                "the three services to be scraped",
            )
            assert {t["labels"]["job"] for t in targets} == {
                "ds-assigner",
                "ds-sidecar",
                "ds-notifier",
            }

            # The recording rule sees exactly the backlog: every record after the commit.
            lag = prom.wait_until(
                lambda: (
                    (r := prometheus.query(f'ds:group_lag_records:sum{{group="{group}"}}'))
                    and float(r[0]["value"][1]) >= BACKLOG
                    and r
                ),
                90,
                "the group's lag in Prometheus",
            )
            assert float(lag[0]["value"][1]) == BACKLOG

            # Alertmanager has the alert, for this group, routed to the orders team.
            alerts = prom.wait_until(
                lambda: alertmanager.alerts(alertname=ALERT, group=group),
                90,
                f"{ALERT} in Alertmanager",
            )
            (alert,) = alerts
            assert alert["labels"]["severity"] == "warning"
            assert [r["name"] for r in alert["receivers"]] == ["orders-team"]
            assert alert["status"]["state"] == "active"
            assert group in alert["annotations"]["summary"]
            assert alert["annotations"]["runbook"]

            # Prometheus shows the rule firing for the group.
            rule = prometheus.alert_rule(ALERT)
            assert rule is not None and rule["state"] == "firing"
            firing = [a for a in rule["alerts"] if a["labels"].get("group") == group]
            assert firing and firing[0]["state"] == "firing"

            # And the orders team's webhook got the notification.
            posted = prom.wait_until(
                lambda: [
                    a
                    for path, body in sink.received
                    if path == "/alerts/orders"
                    for a in body.get("alerts", [])
                    if a["labels"].get("alertname") == ALERT and a["labels"].get("group") == group
                ],
                60,
                "the webhook notification",
            )
            assert posted[0]["status"] == "firing"
            print(
                f"{ALERT} for {group}: lag {lag[0]['value'][1]} records, receiver orders-team, "
                f"{len(sink.received)} webhook post(s)"
            )
        finally:
            if prometheus is not None:
                prometheus.stop()
            alertmanager.stop()
