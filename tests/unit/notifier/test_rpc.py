"""NotifierService through an in-process gRPC server, without a Kafka broker.

The real servicer runs on a real grpc.aio server on port 0 over the real fault pipeline
(storm suppression, the SQLite outbox, alert routing, the history and its watchers) and the
real template service. Only Kafka I/O at the edge is replaced: the Kafka relay by
:class:`KafkaEdge`, which confirms every queued item as Kafka would, and the compacted
template topic by :class:`MemoryTemplateStore` (the harness: tests/support/notifier_rpc.py).
Every RPC is checked for its request validation and its error mapping (status code and
ErrorInfo reason, as documented in notifier.proto and clients/python/src/dsclient/reasons.py),
and for its happy path.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import duration_pb2

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier.outbox import KAFKA_LANE
from tests.support.notifier_rpc import (
    FAULTS_TOPIC,
    Notifier,
    bad_field,
    fault,
    kafka_down,
    refused,
    report,
    run,
)

BAD_REPORTS = [
    ("event.id", fault(id="not-a-uuid")),
    ("event.id", fault(id=str(uuid.uuid4()).upper())),
    ("event.type", fault(type=common_pb2.FAULT_TYPE_UNSPECIFIED)),
    ("event.type", fault(type=999)),
    ("event.state", fault(state=common_pb2.FAULT_STATE_UNSPECIFIED)),
    ("event.severity", fault(severity=common_pb2.SEVERITY_UNSPECIFIED)),
    ("event.severity", fault(severity=99)),
    ("event.source_service", fault(source_service="")),
    ("event.group", fault(group="g" * 256)),
    ("event.client_id", fault(client_id="c" * 256)),
    ("event.partitions", fault(partitions=[0, -1])),
    ("event.attributes", fault(attributes={f"k{i}": "v" for i in range(65)})),
    ("event.message", fault(message="é" * 2049)),  # 4098 bytes in UTF-8
    ("event.dedupe_key", fault(dedupe_key="k" * 1025)),
    ("event.suppressed_count", fault(suppressed_count=-1)),
]


@pytest.mark.parametrize(("field_name", "event"), BAD_REPORTS)
def test_report_fault_refuses_an_invalid_event_before_storing_anything(
    tmp_path: Path, field_name: str, event: common_pb2.FaultEvent
) -> None:
    async def body(n: Notifier) -> None:
        answer = await refused(n.stub.ReportFault(report(event)))
        assert answer == bad_field(field_name)
        assert n.kafka.published == [] and n.outbox.pending(KAFKA_LANE, 10) == []

    run(tmp_path, body)


def test_report_fault_requires_an_event(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        answer = await refused(n.stub.ReportFault(notifier_pb2.ReportFaultRequest()))
        assert answer == bad_field("event")

    run(tmp_path, body)


def test_report_fault_publishes_answers_re_reports_alike_and_suppresses_storms(
    tmp_path: Path,
) -> None:
    async def body(n: Notifier) -> None:
        first = await n.stub.ReportFault(report(fault()))
        assert str(uuid.UUID(first.event_id)) == first.event_id and not first.suppressed
        (published,) = n.kafka.to(FAULTS_TOPIC)
        assert published.id == first.event_id and published.key == b"g"
        assert dict(published.headers)["ds-id"] == first.event_id

        # A reporter's retry of an id it chose is answered as before, and not published again.
        chosen = str(uuid.uuid4())
        again = [await n.stub.ReportFault(report(fault(id=chosen, group="h"))) for _ in range(2)]
        assert again[0] == again[1] == notifier_pb2.ReportFaultResponse(event_id=chosen)
        assert [i.id for i in n.kafka.to(FAULTS_TOPIC)] == [first.event_id, chosen]

        # The same fault again inside its window is counted, not published.
        storm = await n.stub.ReportFault(report(fault()))
        assert storm.suppressed and storm.event_id != first.event_id
        assert len(n.kafka.to(FAULTS_TOPIC)) == 2

        # A change of state is published at once.
        resolved = await n.stub.ReportFault(report(fault(state=common_pb2.FAULT_STATE_RESOLVED)))
        assert not resolved.suppressed
        assert n.kafka.to(FAULTS_TOPIC)[-1].id == resolved.event_id

    run(tmp_path, body)


def test_the_timer_is_woken_by_what_brings_its_next_deadline_nearer(tmp_path: Path) -> None:
    """The notifier's timer sleeps until the pipeline's next deadline (tick_wake.py): a
    published fault (its alerts may be held) and a suppressed report (its window's summary)
    end that sleep. (When each is due: the properties in test_suppression.py and
    test_templates.py.)"""

    async def body(n: Notifier) -> None:
        pipeline, wake = n.pipeline, n.pipeline.tick_wake

        def sleeping() -> asyncio.Task[float]:
            return asyncio.create_task(wake.sleep(wake.clock(), wake.clock() + 60, 0.0))

        await pipeline.tick()  # the gauge: due again in 5 s
        assert pipeline.due() > wake.clock()
        timer = sleeping()
        await asyncio.sleep(0.05)
        assert not timer.done()  # nothing poked it
        first = await n.stub.ReportFault(report(fault()))
        await asyncio.wait_for(timer, 10)  # published (KafkaEdge confirms it): poked
        assert [e.id for e in pipeline.recent()] == [first.event_id]

        timer = sleeping()
        storm = await n.stub.ReportFault(report(fault()))
        assert storm.suppressed
        await asyncio.wait_for(timer, 10)  # suppressed: poked

    run(tmp_path, body)


def test_report_fault_is_unavailable_when_the_outbox_is_not_writable(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        n.outbox.close()
        answer = await refused(n.stub.ReportFault(report(fault())))
        assert answer == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY", {})

    run(tmp_path, body)


def test_a_published_fault_queues_the_alert_of_a_matching_template(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        await n.stub.PutAlertTemplate(put(template(groups=["g"])))
        reported = await n.stub.ReportFault(report(fault(group="g")))
        await n.stub.ReportFault(report(fault(group="other")))
        (alert,) = n.kafka.to("ds.alerts.team-a")
        assert dict(alert.headers)["ds-fault-id"] == reported.event_id
        assert alert.value == b"COMMIT_FAILED in g"

    run(tmp_path, body)


# ---- ListFaults -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "field_name"),
    [
        ({"page_size": -1}, "page_size"),
        ({"page_size": 1001}, "page_size"),
        ({"page_token": "abc"}, "page_token"),
        ({"page_token": "-2"}, "page_token"),
        # Unicode digits: str.isdigit() says yes, int() says no (found by the long fuzz).
        ({"page_token": "\u00b9"}, "page_token"),
        ({"page_token": "\u0663"}, "page_token"),
        ({"page_token": "9" * 40}, "page_token"),
        ({"types": [common_pb2.FAULT_TYPE_UNSPECIFIED]}, "types[0]"),
        ({"types": [common_pb2.FAULT_TYPE_COMMIT_FAILED, 999]}, "types[1]"),
    ],
)
def test_list_faults_refuses_bad_paging_and_filters(
    tmp_path: Path, request_fields: dict[str, Any], field_name: str
) -> None:
    async def body(n: Notifier) -> None:
        request = notifier_pb2.ListFaultsRequest(**request_fields)
        assert await refused(n.stub.ListFaults(request)) == bad_field(field_name)

    run(tmp_path, body)


def test_list_faults_pages_newest_first_and_filters(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        for i in range(5):
            await n.stub.ReportFault(report(fault(group=f"g{i}")))
        lag = fault(type=common_pb2.FAULT_TYPE_LAG_ERROR, source_service="notifier", group="g1")
        await n.stub.ReportFault(report(lag))

        pages: list[list[str]] = []
        token = ""
        while True:
            page = await n.stub.ListFaults(
                notifier_pb2.ListFaultsRequest(page_size=2, page_token=token)
            )
            pages.append([e.group for e in page.faults])
            token = page.next_page_token
            if not token:
                break
        assert pages == [["g1", "g4"], ["g3", "g2"], ["g1", "g0"]]

        of_g1 = await n.stub.ListFaults(notifier_pb2.ListFaultsRequest(group="g1"))
        assert [e.type for e in of_g1.faults] == [
            common_pb2.FAULT_TYPE_LAG_ERROR,
            common_pb2.FAULT_TYPE_COMMIT_FAILED,
        ]
        lags = await n.stub.ListFaults(
            notifier_pb2.ListFaultsRequest(types=[common_pb2.FAULT_TYPE_LAG_ERROR])
        )
        assert [e.group for e in lags.faults] == ["g1"] and lags.next_page_token == ""
        past_the_end = await n.stub.ListFaults(notifier_pb2.ListFaultsRequest(page_token="99"))
        assert list(past_the_end.faults) == [] and past_the_end.next_page_token == ""

    run(tmp_path, body)


def test_list_faults_open_only_leaves_out_resolved_faults(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        await n.stub.ReportFault(report(fault(group="fixed")))
        await n.stub.ReportFault(report(fault(group="broken")))
        await n.stub.ReportFault(
            report(fault(group="fixed", state=common_pb2.FAULT_STATE_RESOLVED))
        )
        everything = await n.stub.ListFaults(notifier_pb2.ListFaultsRequest())
        assert len(everything.faults) == 3
        still_open = await n.stub.ListFaults(notifier_pb2.ListFaultsRequest(open_only=True))
        assert [e.group for e in still_open.faults] == ["broken"]

    run(tmp_path, body)


# ---- WatchFaults ----------------------------------------------------------------------------


def test_watch_faults_refuses_an_unspecified_type(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        call = n.stub.WatchFaults(
            notifier_pb2.WatchFaultsRequest(types=[common_pb2.FAULT_TYPE_UNSPECIFIED])
        )
        assert await refused(call.read()) == bad_field("types[0]")

    run(tmp_path, body)


def test_watch_faults_streams_matching_faults_published_from_now_on(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        before = await n.stub.ReportFault(report(fault(group="watched", partitions=[9])))
        call = n.stub.WatchFaults(
            notifier_pb2.WatchFaultsRequest(
                group="watched", types=[common_pb2.FAULT_TYPE_COMMIT_FAILED]
            )
        )
        first = asyncio.ensure_future(call.read())
        # The stream is open once it delivers: report (distinct faults) until it does.
        partition = 0
        while not first.done():
            partition += 1
            await n.stub.ReportFault(report(fault(group="watched", partitions=[partition])))
            await asyncio.wait([first], timeout=0.05)
        seen = first.result()
        assert isinstance(seen, notifier_pb2.WatchFaultsResponse)
        assert seen.event.group == "watched" and seen.event.id != before.event_id

        await n.stub.ReportFault(report(fault(group="other")))
        lag = fault(
            type=common_pb2.FAULT_TYPE_LAG_ERROR, source_service="notifier", group="watched"
        )
        await n.stub.ReportFault(report(lag))
        wanted = await n.stub.ReportFault(report(fault(group="watched", partitions=[100])))
        # Faults of the earlier rounds may still be queued; then comes the wanted one,
        # and nothing of another group or type ever does.
        while True:
            event = (await call.read()).event
            assert event.group == "watched" and event.type == common_pb2.FAULT_TYPE_COMMIT_FAILED
            if event.id == wanted.event_id:
                break
        call.cancel()

    run(tmp_path, body)


# ---- PutAlertTemplate -------------------------------------------------------------------------


def template(**fields: Any) -> notifier_pb2.AlertTemplate:
    """A valid Kafka-routed template; ``fields`` override."""
    values: dict[str, Any] = {
        "caller": "team-a",
        "name": "commits",
        "open_template": "{{ type }} in {{ group }}",
        "kafka": notifier_pb2.KafkaRoute(),
    }
    values.update(fields)
    return notifier_pb2.AlertTemplate(**values)


def put(
    t: notifier_pb2.AlertTemplate, request_id: str = ""
) -> notifier_pb2.PutAlertTemplateRequest:
    return notifier_pb2.PutAlertTemplateRequest(template=t, request_id=request_id)


BAD_TEMPLATES = [
    ("template.caller", template(caller="")),
    ("template.caller", template(caller="team a")),
    ("template.name", template(name="x" * 129)),
    ("template.groups[1]", template(groups=["g", ""])),
    ("template.fault_types[0]", template(fault_types=[common_pb2.FAULT_TYPE_UNSPECIFIED])),
    ("template.min_severity", template(min_severity=42)),
    ("template.open_template", template(open_template="{{ group")),
    ("template.resolved_template", template(resolved_template="{% if %}")),
    (
        "template.send_interval",
        template(send_interval=duration_pb2.Duration(seconds=8 * 24 * 3600)),
    ),
    ("template.route", notifier_pb2.AlertTemplate(caller="team-a", name="n", open_template="x")),
    ("template.kafka.topic", template(kafka=notifier_pb2.KafkaRoute(topic="bad topic"))),
    ("template.webhook.url", template(webhook=notifier_pb2.WebhookRoute(url="ftp://host/x"))),
]


@pytest.mark.parametrize(("field_name", "bad"), BAD_TEMPLATES)
def test_put_alert_template_refuses_an_invalid_template(
    tmp_path: Path, field_name: str, bad: notifier_pb2.AlertTemplate
) -> None:
    async def body(n: Notifier) -> None:
        answer = await refused(n.stub.PutAlertTemplate(put(bad)))
        assert answer == bad_field(field_name)
        assert n.store.records == {} and n.topics.created == []

    run(tmp_path, body)


def test_put_alert_template_requires_a_template_and_a_uuid_request_id(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        empty = notifier_pb2.PutAlertTemplateRequest()
        assert await refused(n.stub.PutAlertTemplate(empty)) == bad_field("template")
        bad_id = put(template(), request_id="once")
        assert await refused(n.stub.PutAlertTemplate(bad_id)) == bad_field("request_id")
        assert n.store.records == {}

    run(tmp_path, body)


def test_put_alert_template_stores_it_and_creates_its_alerts_topic(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        stored = (await n.stub.PutAlertTemplate(put(template()))).template
        assert stored.kafka.topic == "ds.alerts.team-a"
        assert n.topics.created == ["ds.alerts.team-a"]
        assert n.store.records == {("team-a", "commits"): stored}

        named = template(name="named", kafka=notifier_pb2.KafkaRoute(topic="ds.alerts.own"))
        assert (await n.stub.PutAlertTemplate(put(named))).template == named
        hook = template(name="hook", webhook=notifier_pb2.WebhookRoute(url="https://h/x"))
        assert (await n.stub.PutAlertTemplate(put(hook))).template == hook
        assert n.topics.created == ["ds.alerts.team-a", "ds.alerts.own"]

    run(tmp_path, body)


def test_put_alert_template_with_a_repeated_request_id_answers_as_the_first_time(
    tmp_path: Path,
) -> None:
    async def body(n: Notifier) -> None:
        request_id = str(uuid.uuid4())
        first = await n.stub.PutAlertTemplate(put(template(), request_id))
        retry = await n.stub.PutAlertTemplate(put(template(open_template="changed"), request_id))
        assert retry == first
        assert n.store.get("team-a", "commits") == first.template

    run(tmp_path, body)


def test_put_alert_template_is_unavailable_while_kafka_is(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        n.ready.clear()
        assert await refused(n.stub.PutAlertTemplate(put(template()))) == (
            grpc.StatusCode.UNAVAILABLE,
            "SERVICE_NOT_READY",
            {},
        )
        n.ready.set()
        n.topics.failure = kafka_down()
        assert await refused(n.stub.PutAlertTemplate(put(template()))) == (
            grpc.StatusCode.UNAVAILABLE,
            "KAFKA_UNAVAILABLE",
            {},
        )
        n.topics.failure = None
        n.store.failure = kafka_down()
        assert await refused(n.stub.PutAlertTemplate(put(template()))) == (
            grpc.StatusCode.UNAVAILABLE,
            "KAFKA_UNAVAILABLE",
            {},
        )
        assert n.store.records == {}

    run(tmp_path, body)


# ---- ListAlertTemplates -----------------------------------------------------------------------


def test_list_alert_templates_refuses_a_bad_caller_name(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        request = notifier_pb2.ListAlertTemplatesRequest(caller="team a")
        assert await refused(n.stub.ListAlertTemplates(request)) == bad_field("caller")

    run(tmp_path, body)


def test_list_alert_templates_by_caller_and_name(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        for caller, name in [("team-b", "x"), ("team-a", "z"), ("team-a", "y")]:
            await n.stub.PutAlertTemplate(put(template(caller=caller, name=name)))
        everything = await n.stub.ListAlertTemplates(notifier_pb2.ListAlertTemplatesRequest())
        assert [(t.caller, t.name) for t in everything.templates] == [
            ("team-a", "y"),
            ("team-a", "z"),
            ("team-b", "x"),
        ]
        of_a = await n.stub.ListAlertTemplates(
            notifier_pb2.ListAlertTemplatesRequest(caller="team-a")
        )
        assert [t.name for t in of_a.templates] == ["y", "z"]
        n.ready.clear()
        answer = await refused(n.stub.ListAlertTemplates(notifier_pb2.ListAlertTemplatesRequest()))
        assert answer == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY", {})

    run(tmp_path, body)


# ---- DeleteAlertTemplate ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "field_name"),
    [
        ({"name": "n"}, "caller"),
        ({"caller": "c"}, "name"),
        ({"caller": "c", "name": "n", "request_id": "1234"}, "request_id"),
    ],
)
def test_delete_alert_template_refuses_a_bad_request(
    tmp_path: Path, request_fields: dict[str, str], field_name: str
) -> None:
    async def body(n: Notifier) -> None:
        request = notifier_pb2.DeleteAlertTemplateRequest(**request_fields)
        assert await refused(n.stub.DeleteAlertTemplate(request)) == bad_field(field_name)

    run(tmp_path, body)


def test_delete_alert_template_deletes_once_and_retries_by_request_id(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        await n.stub.PutAlertTemplate(put(template()))
        request = notifier_pb2.DeleteAlertTemplateRequest(
            caller="team-a", name="commits", request_id=str(uuid.uuid4())
        )
        await n.stub.DeleteAlertTemplate(request)
        assert n.store.records == {}
        await n.stub.DeleteAlertTemplate(request)  # a retry of the same delete succeeds
        request.request_id = ""
        assert await refused(n.stub.DeleteAlertTemplate(request)) == (
            grpc.StatusCode.NOT_FOUND,
            "ALERT_TEMPLATE_NOT_FOUND",
            {"caller": "team-a", "name": "commits"},
        )

    run(tmp_path, body)


def test_delete_alert_template_is_unavailable_while_kafka_is(tmp_path: Path) -> None:
    async def body(n: Notifier) -> None:
        await n.stub.PutAlertTemplate(put(template()))
        request = notifier_pb2.DeleteAlertTemplateRequest(caller="team-a", name="commits")
        n.store.failure = kafka_down()
        assert await refused(n.stub.DeleteAlertTemplate(request)) == (
            grpc.StatusCode.UNAVAILABLE,
            "KAFKA_UNAVAILABLE",
            {},
        )
        n.store.failure = None
        n.ready.clear()
        assert await refused(n.stub.DeleteAlertTemplate(request)) == (
            grpc.StatusCode.UNAVAILABLE,
            "SERVICE_NOT_READY",
            {},
        )
        assert ("team-a", "commits") in n.store.records

    run(tmp_path, body)
