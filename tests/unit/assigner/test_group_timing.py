"""A group's own lease TTL and heartbeat interval (issue 36 item 2): only a kafka-fenced
group may choose them, within bounds; the record stores only what differs from the
assigner's; a live change is refused; the GroupRecord carries them through JSON."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.assigner.v1 import types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.admin.records import make_record, record_fields
from services.assigner.admin.validation import validate_group_config
from services.assigner.group_timing import (
    GroupTiming,
    TimingStep,
    check_group_timing,
    check_live_change,
    effective_timing,
    member_ttl,
    record_timing,
    rollout_ttl,
    start_rollout,
)
from services.assigner.state import GroupRecord

DEFAULT = GroupTiming(ttl=3.0, heartbeat=1.0)
KAFKA = types_pb2.COMMIT_FENCING_KAFKA
LEASE = types_pb2.COMMIT_FENCING_LEASE


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def config(**kwargs: object) -> types_pb2.GroupConfig:
    base: dict[str, object] = {
        "name": "orders",
        "topics": ["orders.v1"],
        "mode": common_pb2.GROUP_MODE_LEASED,
    }
    base.update(kwargs)
    return types_pb2.GroupConfig(**base)  # type: ignore[arg-type]


def refused(cfg: types_pb2.GroupConfig) -> DsError:
    with pytest.raises(DsError) as excinfo:
        validate_group_config(cfg, DEFAULT.ttl, DEFAULT.heartbeat)
    assert excinfo.value.reason is Reason.INVALID_FIELD
    return excinfo.value


def test_a_kafka_fenced_group_may_choose_a_short_ttl() -> None:
    cfg = config(commit_fencing=KAFKA, lease_ttl=dur(1.5), heartbeat_interval=dur(0.5))
    validate_group_config(cfg, DEFAULT.ttl, DEFAULT.heartbeat)
    record = make_record(record_fields(cfg, DEFAULT), {})
    assert (record.lease_ttl_seconds, record.heartbeat_interval_seconds) == (1.5, 0.5)
    # A longer one too (fewer heartbeats).
    validate_group_config(
        config(commit_fencing=KAFKA, lease_ttl=dur(30), heartbeat_interval=dur(5)),
        DEFAULT.ttl,
        DEFAULT.heartbeat,
    )


@pytest.mark.parametrize("fencing", [LEASE, types_pb2.COMMIT_FENCING_UNSPECIFIED])
def test_other_groups_keep_the_assigners_timing_and_are_told_why(fencing: int) -> None:
    err = refused(config(commit_fencing=fencing, lease_ttl=dur(6)))
    assert err.metadata["field"] == "group.lease_ttl"
    assert "commit_fencing kafka" in err.message and "TTL 3 s" in err.message
    err = refused(config(commit_fencing=fencing, heartbeat_interval=dur(0.5)))
    assert err.metadata["field"] == "group.heartbeat_interval"
    # The assigner's own values, explicit, are fine (dsctl get | apply round trips).
    validate_group_config(
        config(commit_fencing=fencing, lease_ttl=dur(3), heartbeat_interval=dur(1)), 3.0, 1.0
    )


def test_bounds_of_a_groups_own_timing() -> None:
    err = refused(config(commit_fencing=KAFKA, lease_ttl=dur(1.0), heartbeat_interval=dur(0.4)))
    assert err.metadata["field"] == "group.heartbeat_interval"
    assert "at least 0.5 s" in err.message
    err = refused(config(commit_fencing=KAFKA, lease_ttl=dur(1.4), heartbeat_interval=dur(0.5)))
    assert err.metadata["field"] == "group.lease_ttl"
    assert "3 heartbeat intervals" in err.message
    # The general ranges still apply first.
    err = refused(config(commit_fencing=KAFKA, lease_ttl=dur(0.1)))
    assert err.metadata["field"] == "group.lease_ttl"


def test_check_group_timing_accepts_the_default_whatever_the_fencing() -> None:
    for fencing in ("", "lease", "kafka"):
        check_group_timing(DEFAULT, DEFAULT, fencing)


def test_the_record_stores_only_what_differs_from_the_assigner() -> None:
    assert record_timing(GroupTiming(3.0, 0.5), DEFAULT) == (None, 0.5)
    assert record_timing(DEFAULT, DEFAULT) == (None, None)
    assert effective_timing(None, 0.5, DEFAULT) == GroupTiming(3.0, 0.5)
    assert effective_timing(None, None, DEFAULT) == DEFAULT


def test_a_live_change_is_a_kafka_fenced_groups_only() -> None:
    check_live_change(DEFAULT, GroupTiming(1.5, 0.5), "kafka")
    check_live_change(DEFAULT, DEFAULT, "lease")
    with pytest.raises(DsError) as excinfo:
        check_live_change(GroupTiming(1.5, 0.5), DEFAULT, "lease")
    assert excinfo.value.metadata["field"] == "group.lease_ttl"
    assert "TTL 1.5 s" in excinfo.value.message
    with pytest.raises(DsError) as excinfo:
        check_live_change(DEFAULT, GroupTiming(3.0, 0.5), "")
    assert excinfo.value.metadata["field"] == "group.heartbeat_interval"


def test_a_rollout_expires_by_the_longer_ttl_until_every_member_reported() -> None:
    steps = start_rollout((TimingStep(4, 3.0),), 5, 1.5)
    members = ["a", "b"]
    assert rollout_ttl(steps, {"a": 5, "b": 4}, members) == (3.0, steps)
    assert rollout_ttl(steps, {"a": 5}, members) == (3.0, steps)  # b not reported yet
    assert rollout_ttl(steps, {"a": 5, "b": 6}, members) == (1.5, (TimingStep(5, 1.5),))
    # A member gone (expired, left) no longer holds the rollout back.
    assert rollout_ttl(steps, {"a": 5, "b": 4}, ["a"]) == (1.5, (TimingStep(5, 1.5),))
    # A longer new TTL applies at once: nobody is expired sooner than told.
    longer = start_rollout((TimingStep(4, 1.5),), 5, 6.0)
    assert rollout_ttl(longer, {"a": 4}, ["a"]) == (6.0, longer)


def test_a_change_during_a_rollout_keeps_the_earlier_steps() -> None:
    steps = start_rollout(start_rollout((TimingStep(1, 10.0),), 2, 3.0), 3, 1.5)
    assert member_ttl(steps, None) == 10.0  # not reported: the longest of any step
    assert member_ttl(steps, 0) == 10.0
    assert member_ttl(steps, 2) == 3.0
    assert rollout_ttl(steps, {"a": 2, "b": 3}, ["a", "b"]) == (3.0, steps)
    assert rollout_ttl(steps, {"a": 1, "b": 3}, ["a", "b"]) == (10.0, steps)


@settings(max_examples=300, deadline=None)
@given(
    ttls=st.lists(st.floats(0.5, 300.0), min_size=1, max_size=5),
    reports=st.dictionaries(st.sampled_from("abcdef"), st.none() | st.integers(0, 8), max_size=6),
    members=st.sets(st.sampled_from("abcdef")),
)
def test_never_shorter_than_what_a_member_not_yet_updated_was_told(
    ttls: list[float], reports: dict[str, int | None], members: set[str]
) -> None:
    # Config versions 1, 2, ... each told the members ttls[0], ttls[1], ...
    steps = (TimingStep(1, ttls[0]),)
    for version, ttl in enumerate(ttls[1:], start=2):
        steps = start_rollout(steps, version, ttl)
    current = len(ttls)
    ttl, left = rollout_ttl(steps, reports, members)
    assert ttl >= ttls[-1]
    for m in members:
        version = reports.get(m)
        if version is None or version < current:
            # The TTL told with the version it runs (unreported: it may run any).
            told = max(ttls) if version is None else ttls[max(version, 1) - 1]
            assert ttl >= told
    if all((reports.get(m) or 0) >= current for m in members):
        assert (ttl, left) == (ttls[-1], (steps[-1],))
    else:
        assert left == steps


def test_the_group_record_carries_its_timing_through_json() -> None:
    from services.assigner.state import _GROUP_VALUE

    record = GroupRecord(
        name="g",
        topics=["t"],
        commit_fencing="kafka",
        lease_ttl_seconds=1.5,
        heartbeat_interval_seconds=0.5,
    )
    document = record.to_json()
    assert document["lease_ttl_seconds"] == 1.5
    back = GroupRecord(**_GROUP_VALUE.model_validate(document).model_dump())
    assert back == record
    # A record of a group without its own timing is written as before.
    assert "lease_ttl_seconds" not in GroupRecord(name="g", topics=["t"]).to_json()
