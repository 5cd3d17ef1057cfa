"""What ``dsctl config`` decides and shows (pure): arguments, the next config, member states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.dsctl import config_view
from services.runtime.consumer_config import plan

keys = st.sampled_from(["a.b", "c.d", "e.f", "g.h"])
configs = st.dictionaries(keys, st.sampled_from(["1", "2"]), max_size=4)


def test_assignments_parse_and_refuse_what_is_not_key_value() -> None:
    assert config_view.parse_assignments(["fetch.max.bytes=1048576", "client.rack=a=b"]) == {
        "fetch.max.bytes": "1048576",
        "client.rack": "a=b",  # the value is everything after the first '='
    }
    for bad in (["fetch.max.bytes"], ["=1"], ["k=1", "k=2"]):
        with pytest.raises(ValueError):
            config_view.parse_assignments(bad)


@given(configs, configs, st.lists(keys, unique=True))
def test_the_next_config_sets_and_unsets_exactly_what_was_asked(
    current: dict[str, str], sets: dict[str, str], unsets: list[str]
) -> None:
    unsets = [k for k in unsets if k in current and k not in sets]
    result = config_view.merged(current, sets, unsets)
    assert set(result) == (set(current) - set(unsets)) | set(sets)
    assert all(result[k] == v for k, v in sets.items())
    assert all(result[k] == current[k] for k in result if k not in sets)


def test_unsetting_what_is_not_set_or_also_set_is_refused() -> None:
    with pytest.raises(ValueError, match="does not set"):
        config_view.merged({}, {}, ["a.b"])
    with pytest.raises(ValueError, match="both set and unset"):
        config_view.merged({"a.b": "1"}, {"a.b": "2"}, ["a.b"])


def member(sidecar: str, runs: int, refused: tuple[int, str] | None = None) -> types_pb2.Member:
    m = types_pb2.Member(sidecar_id=sidecar, applied_config_version=runs)
    if refused is not None:
        m.config_rejection.config_version, m.config_rejection.reason = refused
    return m


def test_member_states_for_a_version() -> None:
    described = admin_pb2.DescribeGroupResponse(
        config=types_pb2.GroupConfig(name="g", mode=common_pb2.GROUP_MODE_LEASED, config_version=4),
        members=[member("a", 4), member("b", 3, (4, "no")), member("c", 3), member("d", 5)],
    )
    states = config_view.member_states(described, 4)
    assert [(s["sidecar_id"], s["state"], s["reason"]) for s in states] == [
        ("a", "applied", None),
        ("b", "refused", "no"),
        ("c", "pending", None),
        ("d", "applied", None),
    ]
    assert not config_view.settled(states) and not config_view.all_applied(states)
    # An older refusal does not count against a newer version.
    assert config_view.member_state(member("b", 4, (3, "old")), 4)["state"] == "applied"
    doc = config_view.get_doc(described)
    assert (doc["group"], doc["mode"], doc["config_version"]) == ("g", "leased", 4)


def test_the_set_document_carries_the_diff_versions_and_outcome() -> None:
    before = types_pb2.GroupConfig(
        name="g", config_version=3, consumer_config={"a.b": "1", "c.d": "1"}
    )
    after = types_pb2.GroupConfig(
        name="g", config_version=4, consumer_config={"a.b": "2", "e.f": "1"}
    )
    change = plan(before.consumer_config, after.consumer_config, kafka_group=False)
    states = [{"sidecar_id": "a", "runs_version": 4, "state": "applied", "reason": None}]
    doc = config_view.set_doc(before, after, change, states)
    assert (doc["previous_version"], doc["config_version"], doc["applied"]) == (3, 4, True)
    assert doc["changes"] == {
        "added": {"e.f": "1"},
        "changed": {"a.b": {"from": "1", "to": "2"}},
        "removed": {"c.d": "1"},
        "new_consumer": True,
        "settings": {},
    }
