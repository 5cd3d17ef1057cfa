"""Each alert-template abuse the security issue found, tried on a real notifier on real
Kafka as a user would try it: refused at PutAlertTemplate, or contained when it runs.

Refused: Kafka routes to the assigner's state topic, an application's data topic and
``ds.faults``; webhooks to the cloud metadata address, to Consul on loopback, to a name
allow-listed but resolving to loopback; a template rendering 50 MB; one nested loop that
never ends; one template more than the caller's cap. Contained: a loop that depends on the
fault's data (it passes the trial render) is stopped at the time limit when a fault comes,
the template disabled with a TEMPLATE_FAILED fault, and a fault reported right behind it is
published at once; a webhook that answers with a redirect is not followed; webhook URLs are
redacted in ListAlertTemplates and in the notifier's log.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.reasons import error_info
from services.devstack.kafka import KafkaHandle
from tests.support.mesh import Mesh
from tests.support.notifier import (
    FAULTS_TOPIC,
    TopicReader,
    events,
    fault,
    metric_value,
    notifier_config,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

CALLER = f"team-{uuid.uuid4().hex[:6]}"
SECRET = "T00000/B00000/s3cr3t-token"
NESTED_ON_DATA = (
    "{% for a in range(attributes.n|int) %}{% for b in range(attributes.n|int) %}"
    "{% endfor %}{% endfor %}{{ group }}"
)


class Receiver:
    """A webhook receiver on loopback: records POSTs; ``/redirect`` answers 302 to
    ``/stolen`` (which must never be reached)."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                posts.append(self.path)
                if self.path.startswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", "/stolen")
                else:
                    self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def template(
    name: str, text: str = "{{ type }} on {{ group }}", **route: str
) -> notifier_pb2.AlertTemplate:
    t = notifier_pb2.AlertTemplate(caller=CALLER, name=name, open_template=text)
    if "webhook" in route:
        t.webhook.url = route["webhook"]
    else:
        t.kafka.topic = route.get("topic", "")
    return t


def put(
    stub: notifier_pb2_grpc.NotifierServiceStub, t: notifier_pb2.AlertTemplate
) -> notifier_pb2.AlertTemplate:
    answer: notifier_pb2.PutAlertTemplateResponse = stub.PutAlertTemplate(
        notifier_pb2.PutAlertTemplateRequest(template=t), timeout=30
    )
    return answer.template


def refusal(
    stub: notifier_pb2_grpc.NotifierServiceStub, t: notifier_pb2.AlertTemplate
) -> tuple[str, str, str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        put(stub, t)
    info = error_info(caught.value)
    assert info is not None, caught.value
    return (
        caught.value.code().name,
        info.reason,
        info.metadata.get("field", ""),
        caught.value.details() or "",
    )


def test_template_abuses_are_refused_or_contained(
    mesh: Mesh, kafka_cluster: KafkaHandle, tmp_path: Path, receiver: Receiver
) -> None:
    config = notifier_config(
        tmp_path / "notifier.yaml",
        alerts={
            # The receiver, by address and port; "localhost" by name only.
            "webhook_egress": [f"127.0.0.1:{receiver.port}", "localhost"],
            "render_timeout_seconds": 1.0,
            "max_templates_per_caller": 4,
        },
    )
    notifier = start_notifier(mesh, tmp_path / "outbox.sqlite", config)
    notifier.wait_serving()
    hook = f"http://127.0.0.1:{receiver.port}"
    with notifier_stub(notifier.grpc_addr) as stub:
        # ---- refused at put ----------------------------------------------------------
        refused: dict[str, tuple[str, str, str, str]] = {
            "state topic": refusal(stub, template("a", topic="__ds_assigner_state")),
            "data topic": refusal(stub, template("a", topic="ds.demo")),
            "faults topic": refusal(stub, template("a", topic="ds.faults")),
            "metadata": refusal(
                stub, template("a", webhook="http://169.254.169.254/latest/meta-data/")
            ),
            "consul": refusal(stub, template("a", webhook="http://127.0.0.1:8500/v1/kv/x")),
            # Allowed by name, but it resolves to loopback, not allow-listed on this port.
            "rebinding": refusal(stub, template("a", webhook="http://localhost:9/x")),
            "50 MB": refusal(stub, template("a", "{{ 'x' * 50000000 }}")),
            "loop": refusal(
                stub,
                template(
                    "a",
                    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}"
                    "{% endfor %}",
                ),
            ),
        }
        for what, answer in refused.items():
            print(f"{what:12} -> {answer[0]} {answer[1]} {answer[2]}: {answer[3][:110]}")
        for what in ("state topic", "data topic", "faults topic"):
            assert refused[what][:3] == (
                "INVALID_ARGUMENT",
                "DESTINATION_NOT_ALLOWED",
                "template.kafka.topic",
            ), what
        for what in ("metadata", "consul", "rebinding"):
            assert refused[what][:3] == (
                "INVALID_ARGUMENT",
                "DESTINATION_NOT_ALLOWED",
                "template.webhook.url",
            ), what
        assert "not allow-listed by address" in refused["rebinding"][3]
        assert refused["50 MB"][:3] == (
            "INVALID_ARGUMENT",
            "INVALID_FIELD",
            "template.open_template",
        )
        assert "size limit" in refused["50 MB"][3]
        assert refused["loop"][:3] == (
            "INVALID_ARGUMENT",
            "INVALID_FIELD",
            "template.open_template",
        )
        assert "time limit" in refused["loop"][3]

        # ---- allowed, then contained -------------------------------------------------
        put(stub, template("bomb", NESTED_ON_DATA))  # passes the trial: the sample has no n
        put(stub, template("fine", "{{ type }} on {{ group }}"))
        put(stub, template("secret-hook", webhook=f"{hook}/services/{SECRET}"))
        put(stub, template("redirect", webhook=f"{hook}/redirect/{SECRET}"))
        assert refusal(stub, template("one-more"))[:2] == (
            "RESOURCE_EXHAUSTED",
            "TOO_MANY_TEMPLATES",
        )

        listed = stub.ListAlertTemplates(
            notifier_pb2.ListAlertTemplatesRequest(caller=CALLER), timeout=10
        ).templates
        urls = sorted(t.webhook.url for t in listed if t.WhichOneof("route") == "webhook")
        assert urls == [f"{hook}/…", f"{hook}/…"]
        # A redacted URL cannot be written back by mistake.
        assert refusal(stub, template("redirect", webhook=f"{hook}/…"))[2] == "template.webhook.url"

        reader = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
        alerts = TopicReader(kafka_cluster.bootstrap, f"ds.alerts.{CALLER}")
        try:
            group = f"abuse-{uuid.uuid4().hex[:6]}"
            bomb = fault(common_pb2.FAULT_TYPE_LAG_ERROR, group, message="bomb")
            bomb.attributes["n"] = "100000"
            sent = time.monotonic()
            stub.ReportFault(notifier_pb2.ReportFaultRequest(event=bomb), timeout=10)
            behind = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, group, message="right behind")
            behind_id = stub.ReportFault(
                notifier_pb2.ReportFaultRequest(event=behind), timeout=10
            ).event_id
            reader.wait(lambda m: any(e.id == behind_id for e in events(m)), 30, "the next fault")
            published_after = time.monotonic() - sent
            failed = reader.wait(
                lambda m: [e for e in events(m) if e.type == common_pb2.FAULT_TYPE_TEMPLATE_FAILED],
                60,
                "TEMPLATE_FAILED",
            )
        finally:
            reader.close()
        print(f"the fault behind the bomb was published {published_after:.2f} s after it")
        assert failed[0].attributes["template"] == "bomb"
        assert failed[0].attributes["why"].startswith("time limit")
        (bomb_template,) = [
            t
            for t in stub.ListAlertTemplates(
                notifier_pb2.ListAlertTemplatesRequest(caller=CALLER), timeout=10
            ).templates
            if t.name == "bomb"
        ]
        assert bomb_template.disabled_reason.startswith("time limit")

    # The fine template alerted both faults; the bomb's fault got one line without it.
    try:
        texts = alerts.wait(
            lambda m: [x.value() for x in m] if len(m) >= 3 else None, 60, "3 alerts"
        )
    finally:
        alerts.close()
    assert b"LAG_ERROR on " + group.encode() in texts
    assert any(t.startswith(b"[template " + CALLER.encode() + b"/bomb disabled") for t in texts)

    # Webhooks: the secret one delivered; the redirect not followed (dead-lettered).
    wait_for(lambda: any(p.startswith("/services/") for p in receiver.posts), 30, "the webhook")
    wait_for(
        lambda: metric_value(
            metrics(notifier), "ds_notifier_outbox_dead_letters_total", kind="alert"
        ),
        30,
        "the redirected alerts dead-lettered",
    )
    assert not any(p.startswith("/stolen") for p in receiver.posts)
    log = notifier.tail(2000)
    assert SECRET not in log, "a webhook URL was logged unredacted"
    assert "Traceback" not in log
