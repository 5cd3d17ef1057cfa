"""One real notifier process on a real broker: lag evaluation, alert templates, and
INVALID_ARGUMENT for bad input to every RPC.

Five consumer groups read one topic that a producer appends to steadily; each commits
like one of the issue's scenarios (keeps up, falls behind, stops, stalls, seeks back).
The notifier must reach the Burrow status of each (``ds_group_partition_status``) and
publish the matching LAG_* fault on ``ds.faults``. Then an alert template for a caller
renders LAG_ERROR and its resolution into the caller's topic and a webhook, one message per
send interval for a flapping fault.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from dsclient.reasons import error_info
from services.devstack.kafka import KafkaHandle, TopicFactory, delete_topic
from services.runtime.lag import Status
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    fault,
    header,
    metric_value,
    notifier_config,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

COMMIT_EVERY = 1.2  # > Burrow's min-distance (1 s): every commit is its own window slot
RUN = uuid.uuid4().hex[:8]
EXPECTED = {
    "ok": Status.OK,
    "warn": Status.WARN,
    "stop": Status.STOP,
    "stall": Status.STALL,
    "rewind": Status.REWIND,
}
FAULT_OF = {
    "warn": common_pb2.FAULT_TYPE_LAG_WARNING,
    "stop": common_pb2.FAULT_TYPE_LAG_STOPPED,
    "stall": common_pb2.FAULT_TYPE_LAG_STALLED,
    "rewind": common_pb2.FAULT_TYPE_LAG_REWOUND,
}


def group_name(scenario: str) -> str:
    return f"lag-{RUN}-{scenario}"


@dataclass
class SteadyProducer:
    """Appends ~50 records/s to one partition until stopped."""

    bootstrap: str
    topic: str
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        while not self.stop.is_set():
            for _ in range(5):
                producer.produce(self.topic, value=b"x" * 100)
            producer.poll(0)
            time.sleep(0.1)
        producer.flush(10)


@pytest.fixture(scope="module")
def notifier(
    kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("notifier-lag")
    config = notifier_config(
        tmp / "notifier.yaml",
        lag={
            "poll_seconds": 0.5,
            "evaluate_seconds": 1.0,
            "intervals": 5,
            "min_distance_seconds": 1.0,
            "min_complete": 1.0,
            "group_include": f"^(lag|alert)-{RUN}-",
            "thresholds": {f"alert-{RUN}-lagging": {"error_records": 200}},
        },
        # The test's webhook receiver listens on loopback: allowed by address.
        alerts={"webhook_egress": ["127.0.0.1"]},
    )
    with running_mesh(kafka_cluster.bootstrap, tmp) as mesh:
        svc = start_notifier(mesh, tmp / "outbox.sqlite", config)
        svc.wait_serving(90)
        yield svc


def commit(consumer: Consumer, topic: str, offset: int) -> None:
    consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)


def high_watermark(consumer: Consumer, topic: str) -> int:
    return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])


def drive_scenarios(bootstrap: str, topic: str, rounds: int) -> None:
    """One commit per scenario every COMMIT_EVERY seconds, as each scenario's consumer
    would (assign()-style commits: no group membership, like a leased sidecar)."""
    consumers = {
        s: Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group_name(s), "enable.auto.commit": False}
        )
        for s in EXPECTED
        if s != "ok"
    }
    rewind = itertools.chain([40, 80, 120, 160, 200, 60], itertools.count(100, 40))
    try:
        for i in range(rounds):
            started = time.monotonic()
            commit(consumers["warn"], topic, 10 * (i + 1))  # 8 records/s of 50: behind
            if i < 6:
                commit(consumers["stop"], topic, 10 * (i + 1))  # then stops committing
            commit(consumers["stall"], topic, 5)  # the same offset, again and again
            commit(consumers["rewind"], topic, next(rewind))  # ... 200, then back to 60
            time.sleep(max(0.0, COMMIT_EVERY - (time.monotonic() - started)))
    finally:
        for consumer in consumers.values():
            consumer.close()


def keep_up(bootstrap: str, topic: str, stop: threading.Event) -> None:
    """The consumer that keeps up: commits the end of the log, for as long as the test
    runs (one that stops committing with even a record of lag is, rightly, STOP)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group_name("ok"), "enable.auto.commit": False}
    )
    try:
        while not stop.is_set():
            commit(consumer, topic, high_watermark(consumer, topic))
            stop.wait(COMMIT_EVERY)
    finally:
        consumer.close()


def test_lag_scenarios_reach_burrow_statuses_and_raise_faults(
    notifier: ServiceProcess, kafka_cluster: KafkaHandle, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(1)
    producer = SteadyProducer(kafka_cluster.bootstrap, topic)
    thread = threading.Thread(target=producer.run, daemon=True)
    thread.start()
    faults = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
    seen: dict[str, set[Status]] = {s: set() for s in EXPECTED}
    watching = threading.Event()

    def watch_statuses() -> None:
        while not watching.is_set():
            text = metrics(notifier)
            for scenario in EXPECTED:
                value = metric_value(text, "ds_group_partition_status", group=group_name(scenario))
                if value is not None:
                    seen[scenario].add(Status(int(value)))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch_statuses, daemon=True)
    keeper = threading.Thread(
        target=keep_up, args=(kafka_cluster.bootstrap, topic, watching), daemon=True
    )
    try:
        time.sleep(1.0)  # some records before the first commit
        keeper.start()
        watcher.start()
        drive_scenarios(kafka_cluster.bootstrap, topic, rounds=12)
        wait_for(
            lambda: all(EXPECTED[s] in seen[s] for s in EXPECTED),
            20,
            f"every scenario's status (seen so far: {seen})",
        )
        print({s: sorted(v.name for v in statuses) for s, statuses in seen.items()})
        assert seen["ok"] == {Status.OK}, "the consumer that keeps up is never anything but OK"

        def opened(scenario: str) -> Callable[[list[object]], bool]:
            def check(_messages: list[object]) -> bool:
                return any(
                    e.group == group_name(scenario)
                    and e.type == FAULT_OF[scenario]
                    and e.state == common_pb2.FAULT_STATE_OPEN
                    for e in events(faults.messages)
                )

            return check

        for scenario in FAULT_OF:
            faults.wait(opened(scenario), 20, f"{scenario}: its LAG fault")
        published = events(faults.messages)
        ok_faults = [e for e in published if e.group == group_name("ok")]
        assert ok_faults == [], ok_faults
        stopped = next(
            e
            for e in published
            if e.group == group_name("stop") and e.type == common_pb2.FAULT_TYPE_LAG_STOPPED
        )
        assert stopped.source_service == "notifier" and stopped.topic == topic
        assert int(stopped.attributes["lag"]) > 0
        text = metrics(notifier)
        lag_seconds = metric_value(text, "ds_group_lag_seconds", group=group_name("stall"))
        lag_records = metric_value(text, "ds_group_lag_records", group=group_name("stall"))
        assert lag_seconds is not None and lag_seconds > 0
        assert lag_records is not None and lag_records > 0
    finally:
        watching.set()
        keeper.join(15)
        producer.stop.set()
        thread.join(15)
        faults.close()


# ---- alert templates --------------------------------------------------------------------


def put_template(notifier: ServiceProcess, template: notifier_pb2.AlertTemplate) -> None:
    with notifier_stub(notifier.grpc_addr) as stub:
        stub.PutAlertTemplate(
            notifier_pb2.PutAlertTemplateRequest(template=template, request_id=str(uuid.uuid4())),
            timeout=30,
        )


def test_alert_template_renders_routes_and_respects_the_send_interval(
    notifier: ServiceProcess, kafka_cluster: KafkaHandle, topic_factory: TopicFactory
) -> None:
    caller = f"team-{RUN}"
    lagging = f"alert-{RUN}-lagging"
    flapping = f"alert-{RUN}-flapping"
    interval = 3.0
    template = notifier_pb2.AlertTemplate(
        caller=caller,
        name="lag-error",
        groups=[lagging, flapping],
        fault_types=[common_pb2.FAULT_TYPE_LAG_ERROR],
        min_severity=common_pb2.SEVERITY_WARNING,
        open_template="{{ type }} on {{ group }} ({{ severity }})",
        resolved_template="{{ group }} recovered",
    )
    template.send_interval.FromNanoseconds(int(interval * 1e9))
    template.kafka.SetInParent()  # the default topic: ds.alerts.<caller>
    put_template(notifier, template)
    webhook = Receiver(204, record=lambda post: (post.headers, post.body))
    # The same for the flapping group only, to a webhook, through dsctl.
    subprocess.run(
        [sys.executable, "-m", "services.dsctl", "alerts", "put", caller, "lag-error-hook",
         "--open", template.open_template, "--resolved", template.resolved_template,
         "--group", flapping, "--type", "LAG_ERROR", "--min-severity", "warning",
         "--interval", str(interval), "--webhook", webhook.url,
         "--notifier", notifier.grpc_addr],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip

    # dsctl sees both, as JSON.
    listed = subprocess.run(
        [sys.executable, "-m", "services.dsctl", "alerts", "list", "--caller", caller,
         "--notifier", notifier.grpc_addr, "--output", "json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    names = sorted(t["name"] for t in json.loads(listed.stdout)["templates"])
    assert names == ["lag-error", "lag-error-hook"]

    alerts = TopicReader(kafka_cluster.bootstrap, f"ds.alerts.{caller}")
    topic = topic_factory(1)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap,
            "group.id": lagging,
            "enable.auto.commit": False,
        }
    )
    try:
        # 1. A real LAG_ERROR from the evaluator: 300 records behind (threshold 200) ...
        for _ in range(400):
            producer.produce(topic, value=b"x")
        producer.flush(10)
        commit(consumer, topic, 100)

        def texts(_messages: list[object]) -> list[str]:
            return [
                (m.value() or b"").decode()
                for m in alerts.messages
                if (m.key() or b"").decode() == lagging
            ]

        alerts.wait(lambda m: texts(m), 30, "the LAG_ERROR alert")
        assert texts([]) == [f"LAG_ERROR on {lagging} (ERROR)"]
        # ... and its resolution once the group caught up (after the send interval).
        commit(consumer, topic, 400)
        alerts.wait(lambda m: len(texts(m)) >= 2, 30, "the resolved alert")
        assert texts([]) == [f"LAG_ERROR on {lagging} (ERROR)", f"{lagging} recovered"]

        # 2. A flapping LAG_ERROR: 12 state changes in 3 s.
        with notifier_stub(notifier.grpc_addr) as stub:
            for i in range(12):
                state = (
                    common_pb2.FAULT_STATE_OPEN if i % 2 == 0 else common_pb2.FAULT_STATE_RESOLVED
                )
                stub.ReportFault(
                    notifier_pb2.ReportFaultRequest(
                        event=fault(common_pb2.FAULT_TYPE_LAG_ERROR, flapping, state=state)
                    ),
                    timeout=10,
                )
                time.sleep(0.25)

        def flaps(_messages: list[object]) -> list[tuple[int, str]]:
            return [
                (m.timestamp()[1], (m.value() or b"").decode())
                for m in alerts.messages
                if (m.key() or b"").decode() == flapping
            ]

        alerts.wait(
            lambda m: flaps(m) and flaps(m)[-1][1] == f"{flapping} recovered",
            30,
            "the flapping fault's final resolved alert",
        )
        time.sleep(interval + 1)  # nothing more may come
        alerts.poll(1.0)
        sent = flaps([])
        print("flapping alerts:", sent)
        # 12 changes over ~3 s with a 3 s interval: the first, at most one per interval,
        # and the state it ended in.
        assert 2 <= len(sent) <= 3
        assert sent[0][1] == f"LAG_ERROR on {flapping} (ERROR)"
        assert sent[-1][1] == f"{flapping} recovered"
        gaps = [(b - a) / 1000 for (a, _x), (b, _y) in itertools.pairwise(sent)]
        assert all(gap >= interval - 0.5 for gap in gaps), gaps
        hook_bodies = wait_for(
            lambda: (
                [b for _h, b in webhook.received] if len(webhook.received) >= len(sent) else None
            ),
            30,
            "webhook alerts",
        )
        assert hook_bodies[0] == f"LAG_ERROR on {flapping} (ERROR)"
        assert hook_bodies[-1] == f"{flapping} recovered"
        assert len(hook_bodies) == len(sent)
        assert all(
            h.get("x-ds-id") and h.get("x-ds-caller") == caller for h, _b in webhook.received
        )
        ids = [header(m, "ds-id") for m in alerts.messages]
        assert len(ids) == len(set(ids)), "an alert was sent twice"
    finally:
        consumer.close()
        alerts.close()
        webhook.close()
        delete_topic(kafka_cluster.bootstrap, f"ds.alerts.{caller}")
        with notifier_stub(notifier.grpc_addr) as stub:
            for name in ("lag-error", "lag-error-hook"):
                with contextlib.suppress(grpc.RpcError):
                    stub.DeleteAlertTemplate(
                        notifier_pb2.DeleteAlertTemplateRequest(caller=caller, name=name),
                        timeout=30,
                    )


# ---- bad input ----------------------------------------------------------------------------


def _invalid(call: Callable[[], object], field: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, err.details())  # type: ignore[attr-defined]
    info = error_info(err)
    assert info is not None and info.reason == "INVALID_FIELD" and info.domain == "dataservice"
    assert info.metadata["field"] == field, (field, dict(info.metadata))


def test_bad_input_to_every_rpc_is_invalid_argument(notifier: ServiceProcess) -> None:
    good = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, "g")
    with notifier_stub(notifier.grpc_addr) as stub:

        def report(event: common_pb2.FaultEvent | None) -> Callable[[], object]:
            request = notifier_pb2.ReportFaultRequest()
            if event is not None:
                request.event.CopyFrom(event)
            return lambda: stub.ReportFault(request, timeout=10)

        def changed(**fields: object) -> common_pb2.FaultEvent:
            event = common_pb2.FaultEvent()
            event.CopyFrom(good)
            for key, value in fields.items():
                setattr(event, key, value)
            return event

        _invalid(report(None), "event")
        _invalid(report(changed(type=0)), "event.type")
        _invalid(report(changed(type=99)), "event.type")  # unknown fault type
        _invalid(report(changed(state=0)), "event.state")
        _invalid(report(changed(severity=0)), "event.severity")
        _invalid(report(changed(source_service="")), "event.source_service")
        _invalid(report(changed(id="not-a-uuid")), "event.id")
        many = changed()
        for i in range(65):
            many.attributes[f"k{i}"] = "v"
        _invalid(report(many), "event.attributes")

        _invalid(
            lambda: stub.ListFaults(notifier_pb2.ListFaultsRequest(page_size=-1), timeout=10),
            "page_size",
        )
        _invalid(
            lambda: stub.ListFaults(notifier_pb2.ListFaultsRequest(page_token="x"), timeout=10),
            "page_token",
        )
        _invalid(
            lambda: stub.ListFaults(notifier_pb2.ListFaultsRequest(types=[0]), timeout=10),
            "types[0]",
        )
        _invalid(
            lambda: next(
                iter(stub.WatchFaults(notifier_pb2.WatchFaultsRequest(types=[0]), timeout=10))
            ),
            "types[0]",
        )

        def put(template: notifier_pb2.AlertTemplate | None, **kw: str) -> Callable[[], object]:
            request = notifier_pb2.PutAlertTemplateRequest(**kw)  # type: ignore[arg-type]
            if template is not None:
                request.template.CopyFrom(template)
            return lambda: stub.PutAlertTemplate(request, timeout=10)

        base = notifier_pb2.AlertTemplate(caller="team-a", name="t", open_template="{{ group }}")
        base.kafka.SetInParent()

        def variant(**fields: object) -> notifier_pb2.AlertTemplate:
            t = notifier_pb2.AlertTemplate()
            t.CopyFrom(base)
            for key, value in fields.items():
                if key == "webhook":
                    t.webhook.url = str(value)
                elif key == "no_route":
                    t.ClearField("kafka")
                elif key == "fault_types":
                    t.fault_types.extend(value)  # type: ignore[arg-type]
                else:
                    setattr(t, key, value)
            return t

        _invalid(put(None), "template")
        _invalid(put(variant(open_template="{{ group ")), "template.open_template")
        _invalid(put(variant(resolved_template="{% for %}")), "template.resolved_template")
        _invalid(put(variant(webhook="ftp://hooks.example.com/x")), "template.webhook.url")
        _invalid(put(variant(no_route=True)), "template.route")
        _invalid(put(variant(caller="")), "template.caller")
        _invalid(put(variant(fault_types=[0])), "template.fault_types[0]")
        _invalid(put(base, request_id="not-a-uuid"), "request_id")

        _invalid(
            lambda: stub.ListAlertTemplates(
                notifier_pb2.ListAlertTemplatesRequest(caller="no spaces!"), timeout=10
            ),
            "caller",
        )
        _invalid(
            lambda: stub.DeleteAlertTemplate(
                notifier_pb2.DeleteAlertTemplateRequest(name="t"), timeout=10
            ),
            "caller",
        )
        _invalid(
            lambda: stub.DeleteAlertTemplate(
                notifier_pb2.DeleteAlertTemplateRequest(caller="team-a"), timeout=10
            ),
            "name",
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub.DeleteAlertTemplate(
                notifier_pb2.DeleteAlertTemplateRequest(caller="team-a", name="nope"), timeout=10
            )
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        info = error_info(caught.value)
        assert info is not None and info.reason == "ALERT_TEMPLATE_NOT_FOUND"

        # A valid report still works after all that, and a re-sent id is answered as before.
        first = stub.ReportFault(notifier_pb2.ReportFaultRequest(event=good), timeout=10)
        again = stub.ReportFault(
            notifier_pb2.ReportFaultRequest(event=changed(id=first.event_id)), timeout=10
        )
        assert (again.event_id, again.suppressed) == (first.event_id, first.suppressed)
    assert "Traceback" not in notifier.tail(1000)
