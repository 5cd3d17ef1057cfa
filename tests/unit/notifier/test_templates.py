"""Alert templates: validation, matching, sandboxed rendering, the send interval."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier import templates

OPEN = common_pb2.FAULT_STATE_OPEN
RESOLVED = common_pb2.FAULT_STATE_RESOLVED


def template(**overrides: object) -> notifier_pb2.AlertTemplate:
    t = notifier_pb2.AlertTemplate(
        caller="team-a",
        name="lag",
        groups=["billing"],
        fault_types=[common_pb2.FAULT_TYPE_LAG_ERROR],
        min_severity=common_pb2.SEVERITY_WARNING,
        open_template="{{ type }} {{ state }} on {{ group }}: {{ attributes.lag }} behind",
        resolved_template="{{ group }} recovered",
    )
    t.kafka.topic = ""
    for key, value in overrides.items():
        if key == "webhook":
            t.webhook.url = str(value)
        else:
            setattr(t, key, value)
    return t


def event(state: int = OPEN, **fields: object) -> common_pb2.FaultEvent:
    e = common_pb2.FaultEvent(
        id="00000000-0000-4000-8000-000000000001",
        type=common_pb2.FAULT_TYPE_LAG_ERROR,
        state=state,  # type: ignore[arg-type]
        severity=common_pb2.SEVERITY_ERROR,
        source_service="notifier",
        group="billing",
        dedupe_key="LAG_ERROR|billing",
    )
    e.attributes["lag"] = "1200"
    for key, value in fields.items():
        setattr(e, key, value)
    return e


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"caller": ""}, "template.caller"),
        ({"caller": "bad caller!"}, "template.caller"),
        ({"name": ""}, "template.name"),
        ({"open_template": ""}, "template.open_template"),
        ({"open_template": "{{ group "}, "template.open_template"),
        ({"resolved_template": "{% if %}"}, "template.resolved_template"),
        ({"webhook": "ftp://example.invalid/hook"}, "template.webhook.url"),
        ({"webhook": "not a url"}, "template.webhook.url"),
    ],
)
def test_invalid_templates_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(templates.TemplateInvalid) as caught:
        templates.validate(template(**overrides))
    assert caught.value.field == field


def test_unspecified_type_and_missing_route_are_invalid() -> None:
    t = template()
    t.fault_types.append(common_pb2.FAULT_TYPE_UNSPECIFIED)
    with pytest.raises(templates.TemplateInvalid, match="fault_types"):
        templates.validate(t)
    t = template()
    t.ClearField("kafka")
    with pytest.raises(templates.TemplateInvalid, match="route"):
        templates.validate(t)


def test_valid_template_and_default_topic() -> None:
    t = template()
    templates.validate(t)
    assert templates.kafka_topic(t, "ds.alerts.") == "ds.alerts.team-a"
    templates.validate(template(webhook="https://hooks.example.com/x"))


def test_matching() -> None:
    t = template()
    assert templates.matches(t, event())
    assert not templates.matches(t, event(group="other"))
    assert not templates.matches(t, event(severity=common_pb2.SEVERITY_INFO))
    assert not templates.matches(t, event(type=common_pb2.FAULT_TYPE_LAG_WARNING))
    assert templates.matches(notifier_pb2.AlertTemplate(caller="x", name="all"), event())


def test_rendering_uses_event_fields() -> None:
    t = template()
    assert templates.render(t.open_template, event()) == "LAG_ERROR OPEN on billing: 1200 behind"
    assert templates.render("{{ missing }}|{{ partitions|length }}", event()) == "|0"


def test_sandbox_refuses_internals() -> None:
    with pytest.raises(Exception, match=r"unsafe|not safely|access"):
        templates.render("{{ group.__class__.__mro__ }}", event())


def test_send_interval_flapping_sends_one_per_interval_and_the_final_state() -> None:
    limiter = templates.SendLimiter()
    key = ("team-a", "lag", "LAG_ERROR|billing")
    sent: list[tuple[float, int]] = []
    # A fault flapping every 0.5 s for 10 s, interval 4 s, due() checked every 0.5 s.
    for step in range(21):
        now = step * 0.5
        state = OPEN if step % 2 == 0 else RESOLVED
        if step < 20 and limiter.offer(key, event(state), 4.0, now).send:
            sent.append((now, state))
        sent += [(now, e.state) for _k, e in limiter.due(now)]
    for later in range(21, 40):
        sent += [(later * 0.5, e.state) for _k, e in limiter.due(later * 0.5)]
    times = [t for t, _s in sent]
    assert all(b - a >= 4.0 for a, b in itertools.pairwise(times)), sent
    assert sent[-1][1] == RESOLVED  # the last state (step 19) is told in the end
    assert len(sent) <= 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=1.5),  # gap to the previous offer
            st.sampled_from(["k1", "k2"]),
            st.sampled_from([OPEN, RESOLVED]),
        ),
        max_size=60,
    )
)
def test_nothing_held_is_due_before_next_due_and_the_held_event_is_decided_at_it(
    steps: list[tuple[float, str, int]],
) -> None:
    """The notifier's timer sleeps until next_due() (unless a published fault pokes it):
    due() sends nothing before it; at it, the held event is decided (sent if it changes
    what was told, else dropped) and the deadline moves on."""
    limiter = templates.SendLimiter()
    now = 0.0
    for gap, dedupe, state in steps:
        now += gap
        while limiter.next_due() <= now:
            due = limiter.next_due()
            limiter.due(due)
            assert limiter.next_due() > due
        limiter.offer(("c", "t", dedupe), event(state), 1.0, now)
        due = limiter.next_due()
        if due != math.inf:
            assert due > now
            assert limiter.due(due - 1e-6) == []
            assert limiter.next_due() == due
    while limiter.next_due() != math.inf:
        due = limiter.next_due()
        limiter.due(due)
        assert limiter.next_due() > due


def test_zero_interval_sends_every_event() -> None:
    limiter = templates.SendLimiter()
    key = ("c", "n", "k")
    assert all(limiter.offer(key, event(), 0.0, float(i)).send for i in range(5))
