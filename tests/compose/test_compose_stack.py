"""deploy/docker-compose.yml end to end (issue 19): the stack comes up healthy from the
images, then, with records produced throughout and every one counted through the demo
applications (produced, received, lost = 0, each duplicate explained), a sidecar container
is killed, the leading assigner's container restarted and a broker container stopped; a lag
alert travels from the notifier through Prometheus to Alertmanager and its webhook; and
``down -v`` leaves no container, pod or volume. One summary line per fault.

The tests run in file order on one stack (the conftest's session fixture). The lag alert
comes first: after the sidecar kill, the repo's critical DsConsumerLost (lease expiries in
the last 5 minutes) is active for the group and, by the repo's inhibit rule, rightly
suppresses the group's warnings such as the lag alert.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest

from services.devstack import compose
from services.devstack.images import project_version
from services.devstack.ports import port_is_open
from tests.compose.stack import (
    ASSIGNERS,
    BOOTSTRAP,
    GROUP,
    PARTITIONS,
    TOPIC,
    Received,
    Stack,
    account,
    assert_clean,
    http_json,
    run_fault,
    wait_until,
)
from tests.support.accounting import report
from tests.support.prom import WebhookSink
from tests.support.records import SeqProducer

pytestmark = [pytest.mark.compose, pytest.mark.slow, pytest.mark.timeout(1800)]

SERVICES = {
    "kafka-1", "kafka-2", "kafka-3", "kafka-init", "consul", "assigner-1", "assigner-2",
    "notifier", "sidecar-a", "sidecar-b", "demo-a", "demo-b", "prometheus", "alertmanager",
}  # fmt: skip
ALERT = "DsGroupLagRecordsHigh"
BACKLOG = 12_000  # above DsGroupLagRecordsHigh's 10000


def test_stack_is_up_healthy_read_only_and_non_root(stack: Stack) -> None:
    running = {c.service: c for c in compose.containers()}
    assert set(running) == SERVICES
    for service, c in running.items():
        if service == "kafka-init":
            assert (c.state, c.exit_code) == ("exited", 0)  # created the topic and ended
        else:
            assert c.state == "running", f"{service} is {c.state}"
    # One assigner leads (Consul's lock), the other stands by; the group is balanced.
    assert stack.leader() in ASSIGNERS
    stack.wait_balanced()
    mesh = json.loads(stack.podman("inspect", stack.container("sidecar-a")))[0]
    assert mesh["Config"]["User"] == "10001:10001"
    assert mesh["HostConfig"]["ReadonlyRootfs"] is True
    labels = json.loads(stack.podman("image", "inspect", "dataservice-mesh:dev"))[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == project_version()
    assert len(labels["org.opencontainers.image.revision"]) >= 40
    # Prometheus scrapes the three brokers' JMX exporter agents (job kafka): one active
    # controller among them, each broker holding replicas, nothing under-replicated.
    brokers = wait_until(
        lambda: _brokers_up() if len(_brokers_up()) == 3 else None, 60, "the brokers scraped"
    )
    assert set(brokers) == {"kafka-1", "kafka-2", "kafka-3"}
    assert _query("sum(kafka_controller_active_controller_count)") == {"": 1.0}
    assert all(v >= PARTITIONS for v in _query("kafka_server_partition_count").values())
    assert set(_query("kafka_server_under_replicated_partitions").values()) == {0.0}


def _query(expr: str) -> dict[str, float]:
    """An instant query of the stack's Prometheus: each series' broker label (or "") to its
    value."""
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    result = http_json(url)["data"]["result"]
    return {r["metric"].get("broker", ""): float(r["value"][1]) for r in result}


def _brokers_up() -> list[str]:
    return sorted(b for b, v in _query('up{job="kafka"}').items() if v == 1.0)


def _firing(alertname: str) -> list[dict[str, object]]:
    """The stack's Prometheus alerts of that name in state firing (not Alertmanager's: the
    broker alerts route to the platform receiver, whose webhook the test does not check)."""
    alerts = http_json("http://127.0.0.1:9090/api/v1/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def _alerts(**labels: str) -> list[dict[str, object]]:
    query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
    return list(http_json(f"http://127.0.0.1:9093/api/v2/alerts?{query}"))


def test_lag_alert_reaches_alertmanager(
    stack: Stack, received: Received, webhook_sink: WebhookSink
) -> None:
    """Both applications stop reading (their containers paused): the backlog shows as the
    group's lag in the notifier, Prometheus fires the repo's rule, Alertmanager routes it to
    the group's owner (orders-team) and posts it to the webhook; then they resume and read
    every record."""
    started = time.monotonic()
    # First the group consumes and commits a little: the notifier tracks a group's lag from
    # its first commit on.
    warm_up, _ = run_fault(stack, received, lambda: None, before=2.0, after=1.0)
    assert_clean(warm_up)
    apps = [stack.container("demo-a"), stack.container("demo-b")]
    stack.podman("pause", *apps)
    producer = SeqProducer(BOOTSTRAP, TOPIC, PARTITIONS, rate=5_000).start()
    try:
        wait_until(lambda: producer.sent >= BACKLOG, 60, "the backlog produced")
    finally:
        confirmed = producer.stop()
    try:
        alert = wait_until(lambda: _alerts(alertname=ALERT, group=GROUP), 120, ALERT)[0]
        assert [r["name"] for r in alert["receivers"]] == ["orders-team"]
        assert alert["status"]["state"] == "active"
        posted = wait_until(
            lambda: [
                a
                for path, body in webhook_sink.received
                if path == "/alerts/orders"
                for a in body.get("alerts", [])
                if a["labels"].get("alertname") == ALERT and a["labels"].get("group") == GROUP
            ],
            60,
            "the orders team's webhook notification",
        )
        assert posted[0]["status"] == "firing"
        alerted = time.monotonic() - started
    finally:
        stack.podman("unpause", *apps)
    received.wait_all(producer, confirmed, timeout=120)
    result = account(producer, confirmed, received)
    report(
        f"compose: {result.line('both applications paused', time.monotonic() - started)}; "
        f"{ALERT} for {GROUP} at Alertmanager (orders-team) and its webhook after {alerted:.0f}s"
    )
    assert_clean(result)


def test_kill_a_sidecar_container(stack: Stack, received: Received) -> None:
    sidecar = stack.container("sidecar-a")

    def kill_and_come_back() -> None:
        stack.podman("kill", "--signal", "KILL", sidecar)
        # Its leases expire; sidecar-b takes all six partitions.
        wait_until(lambda: stack.holders() == {"sidecar-b": PARTITIONS}, 60, "the handoff")
        if stack.state("sidecar-a") != "running":  # no restart policy ran it again
            stack.podman("start", sidecar)
        stack.wait_healthy("sidecar-a")
        stack.wait_balanced()

    result, seconds = run_fault(stack, received, kill_and_come_back)
    report(f"compose: {result.line('kill sidecar-a (SIGKILL)', seconds)}")
    assert_clean(result)


def test_restart_the_leading_assigner_container(stack: Stack, received: Received) -> None:
    leader = stack.leader()
    assert leader in ASSIGNERS
    service = ASSIGNERS[leader]

    def restart() -> None:
        stack.podman("restart", "--time", "30", stack.container(service))
        stack.wait_healthy(service)
        wait_until(stack.leader, 60, "an assigner leading again")
        stack.wait_balanced()

    result, seconds = run_fault(stack, received, restart)
    report(f"compose: {result.line(f'restart {service} (leader; now {stack.leader()})', seconds)}")
    assert_clean(result)


def test_stop_a_broker_container(stack: Stack, received: Received) -> None:
    broker = stack.container("kafka-2")

    alerted: list[str] = []

    def stop_and_start() -> None:
        stack.podman("stop", "--time", "30", broker)
        stopped = time.monotonic()
        # Its exporter's target goes down and the two brokers left, which now lead every
        # partition with one replica short, fire the under-replicated alert (every `for:`
        # at 2 s in the test's rules).
        firing = wait_until(
            lambda: _firing("DsKafkaUnderReplicatedPartitions"), 60, "under-replicated alert"
        )
        alerted.extend(sorted(str(a["labels"]["broker"]) for a in firing))  # type: ignore[index]
        alerted.append(f"after {time.monotonic() - stopped:.0f}s")
        assert "kafka-2" not in alerted
        # kafka-2's target is down from its first scrape after the stop, which may come
        # after the alert (the others' under-replicated figures can be scraped first): CI
        # saw ['kafka-1', 'kafka-2', 'kafka-3'] up when the alert fired 3 s after the stop.
        wait_until(lambda: _brokers_up() == ["kafka-1", "kafka-3"], 60, "kafka-2's target down")
        # records keep flowing on two brokers (replication 3, min ISR 2)
        time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))
        stack.podman("start", broker)
        stack.wait_healthy("kafka-2")

    result, seconds = run_fault(stack, received, stop_and_start)
    report(
        f"compose: {result.line('stop kafka-2 for 10s', seconds)}; "
        f"DsKafkaUnderReplicatedPartitions firing for {alerted}"
    )
    assert_clean(result)
    assert alerted, "the under-replicated alert never fired"
    # Started again, the followers catch up and the alert clears.
    wait_until(lambda: not _firing("DsKafkaUnderReplicatedPartitions"), 90, "the alert cleared")


def test_down_leaves_nothing(stack: Stack) -> None:
    """Last in the file on purpose: it takes the shared stack down (what it checks is that
    ``down -v`` leaves nothing), so no test can run on the stack after it."""
    compose.down()
    assert compose.leftovers(volumes_before=stack.volumes_before) == []
    # And nothing listens on the stack's ports any more.
    open_ports = [
        p
        for p in (9092, 9192, 9292, 7061, 7161, 7261, 8500, 7070, 7170, 7080, 9090, 9093)
        if port_is_open(p)
    ]
    assert open_ports == []
