"""services/dsctl/group_manifest.py: DsGroup documents and GroupConfig both ways, and the
plan ``dsctl apply`` follows. Properties: a document's managed spec survives the trip to a
GroupConfig and back unchanged; a group applied from a document plans as unchanged against
that document whatever other fields the assigner filled in; exactly the changed managed
fields are planned as the update mask; durations round-trip."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import given
from hypothesis import strategies as st

from dataservice.assigner.v1 import types_pb2
from services.dsctl import group_manifest as m
from services.runtime import group_enums as e

names = st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True)
durations = st.integers(min_value=1, max_value=12 * 3600 * 1000).map(
    lambda ms: f"{ms}ms" if ms % 1000 else m.format_duration(_seconds(ms // 1000))
)


def _seconds(n: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromSeconds(n)
    return d


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"topics": draw(st.lists(names, min_size=1, max_size=3, unique=True))}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "mode": st.sampled_from(sorted(e.MODE_BY_NAME)),
        "consumerConfig": st.dictionaries(names, names, min_size=1, max_size=3),
        "alertTemplateRef": names.map(lambda n: {"name": n}),
        "visibilityTimeout": durations,
        "leaseTtl": durations,
        "heartbeatInterval": durations,
        "maxDeliveries": st.integers(min_value=-1, max_value=100).filter(bool),
        "balanceStrategy": st.sampled_from(sorted(e.BALANCE_STRATEGY_BY_NAME)),
        "externalOffsetChanges": st.sampled_from(sorted(e.EXTERNAL_CHANGE_BY_NAME)),
        "ordering": st.sampled_from(sorted(e.ORDERING_BY_NAME)),
        "commitFencing": st.sampled_from(sorted(e.COMMIT_FENCING_BY_NAME)),
    }
    for key, values in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(values)
    return {
        "apiVersion": m.API_VERSION,
        "kind": m.KIND,
        "metadata": {"name": draw(names)},
        "spec": spec,
    }


def declared(doc: dict[str, Any]) -> dict[str, Any]:
    return {"mode": "leased", **{k: v for k, v in doc["spec"].items() if k in m.PATHS}}


@given(documents())
def test_a_documents_managed_spec_survives_the_round_trip(doc: dict[str, Any]) -> None:
    config = m.config_of(doc)
    assert m.managed_spec(config, m.managed_keys(doc)) == declared(doc)


@given(documents(), st.integers(min_value=1, max_value=50))
def test_a_group_applied_from_a_document_plans_as_unchanged(
    doc: dict[str, Any], version: int
) -> None:
    live = types_pb2.GroupConfig()
    live.CopyFrom(m.config_of(doc))
    live.config_version = version
    # What the assigner fills in for fields the document left out.
    if not live.HasField("lease_ttl"):
        live.lease_ttl.FromSeconds(3)
    if not live.balance_strategy:
        live.balance_strategy = types_pb2.BALANCE_STRATEGY_COUNT
    (change,) = m.plan([doc], {live.name: live})
    assert change.action == "unchanged" and change.paths == ()


@given(documents(), documents())
def test_the_update_mask_is_exactly_the_changed_managed_fields(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    after = {**after, "metadata": before["metadata"]}
    live = m.config_of(before)
    (change,) = m.plan([after], {live.name: live})
    keys = m.managed_keys(after)
    old, new = m.managed_spec(live, keys), declared(after)
    expected = tuple(m.PATHS[k] for k in keys if old.get(k) != new.get(k))
    assert change.paths == expected
    assert change.action == ("update" if expected else "unchanged")


def test_a_group_not_live_is_created() -> None:
    doc = {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": "g"},
           "spec": {"topics": ["t"]}}  # fmt: skip
    (change,) = m.plan([doc], {})
    assert change.action == "create" and change.desired.name == "g"


@given(durations)
def test_durations_round_trip(text: str) -> None:
    assert m.format_duration(m.parse_duration(text, "x")) == text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"topics": []}, "spec.topics must be a non-empty list"),
        ({"topics": ["t"], "mode": "round_robin"}, "spec.mode: 'round_robin' is not one of"),
        ({"topics": ["t"], "leaseTtl": "3 seconds"}, "spec.leaseTtl: '3 seconds' is not a"),
        ({"topics": ["t"], "maxDeliveries": -2}, "spec.maxDeliveries must be an integer >= -1"),
        ({"topics": ["t"], "partitions": 3}, "unknown spec field(s) partitions"),
    ],
)
def test_invalid_documents_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    doc = {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": "g"}, "spec": spec}
    with pytest.raises(m.ManifestError, match="DsGroup g") as raised:
        m.config_of(doc)
    assert message in str(raised.value)


def test_a_group_declared_twice_is_refused() -> None:
    doc = {"apiVersion": m.API_VERSION, "kind": m.KIND, "metadata": {"name": "g"},
           "spec": {"topics": ["t"]}}  # fmt: skip
    with pytest.raises(m.ManifestError, match="declared twice"):
        m.plan([doc, doc], {})
