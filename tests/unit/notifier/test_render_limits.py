"""Templates render in a worker process with a time, output-size and memory limit, off the
Kafka relay's thread; one that passes a limit is disabled (and still alerts its fault once,
without the template). The worker is a real spawned process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier import templates
from services.notifier.alerts import AlertRouter
from services.notifier.egress import EgressPolicy
from services.notifier.metrics import NotifierMetrics
from services.notifier.outbox import KAFKA_LANE, RENDER_LANE
from services.notifier.render_worker import (
    LimitExceeded,
    RenderLimits,
    RenderWorker,
    TemplateError,
)

NESTED = (
    "{% for a in range(attributes.n|int) %}{% for b in range(attributes.n|int) %}"
    "{% endfor %}{% endfor %}done"
)


@pytest.fixture(scope="module")
def worker() -> Iterator[RenderWorker]:
    w = RenderWorker(
        RenderLimits(timeout_seconds=1.0, max_bytes=64 * 1024, memory_bytes=256 * 1024**2)
    )
    # Start the worker process now: its start-up (a spawned interpreter importing Jinja2)
    # is not a render and does not count against the limits the tests time.
    assert w.render("ready", {}) == "ready"
    yield w
    w.close()


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("{{ 'x' * 50000000 }}", "size"),
        ("{% for i in range(100000) %}{{ 'yyyyyyyyyy' }}{% endfor %}", "size"),
        ("{{ 10 ** 100000 }}", "size"),
        ("{{ range(100000)|join('x' * 60000) }}", "memory"),
        (
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "time",
        ),
    ],
)
def test_a_render_past_a_limit_is_stopped(worker: RenderWorker, text: str, limit: str) -> None:
    started = time.monotonic()
    with pytest.raises(LimitExceeded) as caught:
        worker.render(text, {})
    assert caught.value.limit == limit
    assert time.monotonic() - started < 3.0
    # The worker (replaced if it had to be killed) renders the next template at once.
    assert worker.render("{{ group }} ok", {"group": "g"}) == "g ok"


def test_a_template_error_is_not_a_limit(worker: RenderWorker) -> None:
    with pytest.raises(TemplateError, match=r"unsafe|not safely|access|Undefined|attribute"):
        worker.render("{{ group.__class__.__mro__[1].__subclasses__() }}", {"group": "g"})


def event(**attributes: str) -> common_pb2.FaultEvent:
    e = common_pb2.FaultEvent(
        id="00000000-0000-4000-8000-000000000001",
        type=common_pb2.FAULT_TYPE_LAG_ERROR,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_ERROR,
        source_service="notifier",
        group="billing",
        dedupe_key="LAG_ERROR|billing",
    )
    e.attributes.update(attributes)
    return e


def template(name: str, text: str, **route: str) -> notifier_pb2.AlertTemplate:
    t = notifier_pb2.AlertTemplate(caller="team-a", name=name, open_template=text)
    if "webhook" in route:
        t.webhook.url = route["webhook"]
    else:
        t.kafka.topic = route.get("topic", "")
    return t


def router(
    worker: RenderWorker, stored: list[notifier_pb2.AlertTemplate], failed: list[str]
) -> AlertRouter:
    return AlertRouter(
        lambda: stored,
        topic_prefix="ds.alerts.",
        metrics=NotifierMetrics(CollectorRegistry()),
        clock=time.monotonic,
        egress=EgressPolicy(["hooks.example.com"]),
        renderer=worker,
        on_failed=lambda t, why: failed.append(f"{t.name}: {why}"),
    )


def test_a_published_fault_queues_render_jobs_not_rendered_text(worker: RenderWorker) -> None:
    """What the Kafka relay's delivery hook gets back is a job: nothing renders there."""
    failed: list[str] = []
    r = router(worker, [template("bomb", NESTED)], failed)
    (job,) = r.alerts_for(event(n="100000"))
    assert job.lane == RENDER_LANE
    assert json.loads(job.destination) == ["team-a", "bomb"]
    assert failed == []


def test_a_template_past_its_time_limit_is_disabled_and_alerts_once_without_it(
    worker: RenderWorker,
) -> None:
    failed: list[str] = []
    stored = [template("bomb", NESTED), template("fine", "{{ group }} lags")]
    r = router(worker, stored, failed)
    jobs = r.alerts_for(event(n="100000"))
    alerts = [r.render(job) for job in jobs]
    assert failed == ["bomb: time limit: rendering took longer than 1 s"]
    by_template = {dict(a.headers)["ds-template"]: a for a in alerts if a is not None}
    assert by_template["fine"].value == b"billing lags"
    assert by_template["bomb"].lane == KAFKA_LANE
    assert by_template["bomb"].value.startswith(b"[template team-a/bomb disabled, rendering")
    # Disabled: the next fault makes no job for it, until it is put again.
    assert [json.loads(j.destination)[1] for j in r.alerts_for(event(n="1"))] == ["fine"]
    r.enable("team-a", "bomb")
    assert len(r.alerts_for(event(n="2"))) == 2


def test_a_stored_template_whose_route_is_not_allowed_is_disabled(worker: RenderWorker) -> None:
    """Templates stored before the rules (or by hand) are held to them before each alert."""
    failed: list[str] = []
    stored = [
        template("state", "x", topic="__ds_assigner_state"),
        template("data", "x", topic="ds.demo"),
        template("metadata", "x", webhook="http://169.254.169.254/latest/meta-data/"),
    ]
    r = router(worker, stored, failed)
    assert [r.render(job) for job in r.alerts_for(event())] == [None, None, None]
    assert [f.split(":")[0] for f in failed] == ["state", "data", "metadata"]


def test_put_refuses_a_template_past_a_limit_on_a_sample_event(worker: RenderWorker) -> None:
    r = router(worker, [], [])
    r.trial(template("fine", "{{ group }} {{ attributes.lag }} {{ partitions|join(',') }}"))
    r.trial(template("data-dependent", NESTED))  # passes here: the sample has no n
    big = template("big", "ok")
    big.resolved_template = "{{ 'x' * 50000000 }}"
    with pytest.raises(templates.TemplateInvalid, match="size limit") as caught:
        r.trial(big)
    assert caught.value.field == "template.resolved_template"
    with pytest.raises(templates.TemplateInvalid, match="time limit"):
        r.trial(
            template(
                "loop",
                "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
            )
        )
