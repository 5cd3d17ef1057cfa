"""A group's own lease TTL and heartbeat interval (issue 36 item 2): only a kafka-fenced
group may choose them, within bounds; the record stores only what differs from the
assigner's; a live change is refused; the GroupRecord carries them through JSON."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.admin.records import make_record, record_fields
from services.assigner.admin.validation import validate_group_config
from services.assigner.group_timing import (
    GroupTiming,
    check_group_timing,
    check_live_change,
    effective_timing,
    record_timing,
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


def test_a_live_change_is_refused_naming_the_current_timing() -> None:
    check_live_change(DEFAULT, GroupTiming(3.0, 1.0))
    with pytest.raises(DsError) as excinfo:
        check_live_change(GroupTiming(1.5, 0.5), DEFAULT)
    assert excinfo.value.metadata["field"] == "group.lease_ttl"
    assert "TTL 1.5 s" in excinfo.value.message
    with pytest.raises(DsError) as excinfo:
        check_live_change(DEFAULT, GroupTiming(3.0, 0.5))
    assert excinfo.value.metadata["field"] == "group.heartbeat_interval"


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
