"""The assigner's fault hooks (pure logic: a reporter that is never started keeps what it
would send)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from services.assigner.fault_emitters import DeleteAudit, GroupFaults, ResetAudit, report_failover
from tests.support.fault_reports import kinds, reporter


class State(Enum):
    GRANTED = 1
    FREE = 2


@dataclass
class Lease:
    state: State


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


def test_group_faults_lost_moved_and_back() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.granted([(TP("t", 0), "a"), (TP("t", 1), "a")], [Lease(State.GRANTED)] * 2)
    assert kinds(r) == []  # first grants move nothing
    faults.lost("a")
    faults.granted([(TP("t", 0), "b"), (TP("t", 1), "b")], [Lease(State.GRANTED)] * 2)
    faults.joined("a")
    faults.joined("a")
    assert kinds(r) == [
        ("CONSUMER_LOST", "OPEN"),
        ("PARTITIONS_REASSIGNED", "OPEN"),
        ("PARTITIONS_REASSIGNED", "RESOLVED"),
        ("CONSUMER_LOST", "RESOLVED"),
    ]
    moved = r.buffered()[1]
    assert (moved.topic, list(moved.partitions)) == ("t", [0, 1])
    assert dict(moved.attributes) == {"from": "a", "to": "b"}
    lost, resolved = r.buffered()[0], r.buffered()[3]
    assert lost.consumer_id == resolved.consumer_id == "a"
    assert lost.dedupe_key == resolved.dedupe_key


def test_reassignment_resolves_only_when_every_partition_is_held() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.granted([(TP("t", 0), "a")], [Lease(State.GRANTED)])
    faults.granted([(TP("t", 0), "b")], [Lease(State.GRANTED), Lease(State.FREE)])
    faults.granted([], [Lease(State.GRANTED), Lease(State.GRANTED)])
    assert kinds(r) == [("PARTITIONS_REASSIGNED", "OPEN"), ("PARTITIONS_REASSIGNED", "RESOLVED")]


def test_group_faults_left_and_rebound() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.rebound({"a", "b"}, clients=2)  # the first binding: nothing moved
    faults.left("b")
    faults.rebound({"a"}, clients=2)
    faults.rebound({"a"}, clients=2)  # unchanged
    faults.rebound({"a", "c"}, clients=0)  # no client to rebind
    assert kinds(r) == [
        ("CONSUMER_LEFT", "OPEN"),
        ("CLIENT_REBOUND", "OPEN"),
        ("CLIENT_REBOUND", "RESOLVED"),
    ]
    assert r.buffered()[1].attributes["removed"] == "b"


def test_failover_opens_now_and_resolves_after_the_settle_period() -> None:
    r = reporter()
    report_failover(r, "10.0.0.2:7070", settle_seconds=0.2)
    assert kinds(r) == [("ASSIGNER_FAILOVER", "OPEN")]
    deadline = time.monotonic() + 5
    while r.pending < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kinds(r) == [("ASSIGNER_FAILOVER", "OPEN"), ("ASSIGNER_FAILOVER", "RESOLVED")]
    assert r.buffered()[0].attributes["leader"] == "10.0.0.2:7070"


def test_a_refused_consumer_config_opens_per_member_and_resolves_once_a_later_one_runs() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.config_status("a", 1, None)  # runs version 1: nothing to say
    faults.config_status("a", 1, (2, "`fetch.max.bytes` must be >= `message.max.bytes`"))
    faults.config_status("a", 1, (2, "`fetch.max.bytes` must be >= `message.max.bytes`"))
    faults.config_status("a", 1, (3, "refused again"))  # a newer refusal: reported again
    faults.config_status("b", 3, None)
    faults.config_status("a", 4, None)  # applied a later version cleanly
    assert kinds(r) == [
        ("CONFIG_REJECTED", "OPEN"),
        ("CONFIG_REJECTED", "OPEN"),
        ("CONFIG_REJECTED", "RESOLVED"),
    ]
    first, second, resolved = r.buffered()
    assert first.consumer_id == "a" and first.group == "g"
    assert dict(first.attributes) == {
        "config_version": "2",
        "reason": "`fetch.max.bytes` must be >= `message.max.bytes`",
        "running_version": "1",
    }
    assert second.attributes["config_version"] == "3"
    assert first.dedupe_key == second.dedupe_key == resolved.dedupe_key == "CONFIG_REJECTED|g|a"
    assert resolved.consumer_id == "a"


def test_a_refusal_of_a_member_that_leaves_is_resolved() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    faults.gone("a")  # nothing open: nothing sent
    faults.config_status("a", 1, (2, "no"))
    faults.gone("a")
    assert kinds(r) == [("CONFIG_REJECTED", "OPEN"), ("CONFIG_REJECTED", "RESOLVED")]


def test_an_offset_reset_is_audited_per_topic_with_who_and_the_offsets() -> None:
    r = reporter()
    GroupFaults(r, "g").offsets_reset(
        ResetAudit(
            reset_id="r1",
            actor="ops@host",
            source="admin",
            strategy="earliest",
            request_id="req-1",
            partitions=(("t", 1, 120, 0, 4), ("t", 0, 80, 0, 3), ("u", 0, -1, 0, 2)),
        )
    )
    assert kinds(r) == [
        ("OFFSETS_RESET", "OPEN"),
        ("OFFSETS_RESET", "RESOLVED"),
        ("OFFSETS_RESET", "OPEN"),
        ("OFFSETS_RESET", "RESOLVED"),
    ]
    t_open = r.buffered()[0]
    assert (t_open.group, t_open.topic, list(t_open.partitions)) == ("g", "t", [0, 1])
    assert dict(t_open.attributes) == {
        "actor": "ops@host",
        "source": "admin",
        "strategy": "earliest",
        "offsets": "0:80->0,1:120->0",
        "epochs": "0:3,1:4",
        "request_id": "req-1",
    }
    assert t_open.dedupe_key == r.buffered()[1].dedupe_key != r.buffered()[2].dedupe_key
    assert r.buffered()[2].attributes["offsets"] == "0:-1->0"


def test_a_deleted_group_is_audited_once_with_who_and_the_clients_dropped() -> None:
    r = reporter()
    faults = GroupFaults(r, "g")
    audit = DeleteAudit("d-1", "ops-alice (alice@host)", True, ("app-1", "app-2"), 3, "req-9")
    faults.deleted(audit)
    assert kinds(r) == [("GROUP_DELETED", "OPEN"), ("GROUP_DELETED", "RESOLVED")]
    opened = r.buffered()[0]
    assert opened.group == "g"
    assert dict(opened.attributes) == {
        "actor": "ops-alice (alice@host)",
        "forced": "true",
        "clients": "app-1,app-2",
        "config_version": "3",
        "request_id": "req-9",
    }
    assert "deleted by ops-alice (alice@host), 2 bound client(s) dropped" in opened.message
