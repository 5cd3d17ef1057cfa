"""A member whose Session stream ended without a Leave (issue 36: kill -9 failover within
4 s): its Kafka-fenced leases move once the reconnect window has passed, its lease-fenced
ones at their expiry as before; a member that attaches again within the window keeps
everything. The one-holder and never-behind properties with such cuts are in
test_fencing_model.py and test_fencing_model_kafka.py."""

from __future__ import annotations

from services.assigner.coordinator import (
    GroupCoordinator,
    HeldLease,
    Progress,
    Released,
    Timing,
)
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.coordinator_support import grants, holders, member

TIMING = Timing(ttl=3.0, grace=1.0, hold_window=0.0, reconnect_window=1.0)
TPS = [TopicPartition("t", p) for p in range(4)]


def two_members(kafka_fenced: bool) -> GroupCoordinator:
    """a and b attached, two partitions each, every lease renewed by a heartbeat at 2.0
    that reports (or not) its commits fenced at Kafka."""
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    coord.join(member("b"), [], now=0.1)
    for lease in coord.leases.values():
        if lease.holder == "a" and lease.next_holder == "b":
            coord.heartbeat("a", [], [_released(lease.tp, lease.epoch)], now=0.2)
    for mid in ("a", "b"):
        progress = [
            Progress(lease.tp, lease.epoch, kafka_fenced=kafka_fenced)
            for lease in coord.held_by(mid)
        ]
        coord.heartbeat(mid, progress, [], now=2.0)
    assert sorted(holders(coord).values()) == ["a", "a", "b", "b"]
    return coord


def _released(tp: TopicPartition, epoch: int) -> Released:
    return Released(tp, epoch, committed=-1)


def test_kafka_fenced_leases_move_once_the_reconnect_window_has_passed() -> None:
    coord = two_members(kafka_fenced=True)
    a_had = {lease.tp for lease in coord.held_by("a")}
    coord.disconnected("a", now=2.5)
    assert not grants(coord.disconnect_expired(3.4)), "within the window nothing moves"
    out = coord.disconnect_expired(3.5)
    assert out.disconnected == ["a"] and "a" not in coord.members
    moved = grants(out)
    assert {g.tp for g in moved} == a_had and {g.member for g in moved} == {"b"}
    # 3.5 s is before a's leases' expiry (renewed at 2.0: 6.0 at the assigner).
    assert all(coord.leases[tp].holder == "b" for tp in a_had)


def test_lease_fenced_leases_wait_for_their_expiry() -> None:
    coord = two_members(kafka_fenced=False)
    a_had = {lease.tp for lease in coord.held_by("a")}
    coord.disconnected("a", now=2.5)
    out = coord.disconnect_expired(3.5)
    assert out.disconnected == ["a"]
    assert not grants(out), "the holder may serve them until its own deadline"
    assert all(coord.leases[tp].holder == "a" for tp in a_had)
    b_leases = [Progress(lease.tp, lease.epoch) for lease in coord.held_by("b")]
    coord.heartbeat("b", b_leases, [], now=5.0)
    assert not grants(coord.disconnect_expired(6.0))
    out = coord.disconnect_expired(6.01)  # renewed at 2.0 + TTL 3 + grace 1
    assert {g.tp for g in grants(out)} == a_had


def test_a_member_attaching_again_within_the_window_keeps_its_leases() -> None:
    coord = two_members(kafka_fenced=True)
    a_had = [HeldLease(lease.tp, lease.epoch) for lease in coord.held_by("a")]
    coord.disconnected("a", now=2.5)
    out = coord.join(member("a"), a_had, now=3.0)
    assert sorted(out.renewed, key=lambda h: h.tp) == a_had and not grants(out)
    out = coord.disconnect_expired(4.0)
    assert not out.disconnected and not grants(out)
    assert {lease.tp for lease in coord.held_by("a")} == {h.tp for h in a_had}


def test_a_disconnected_member_is_given_nothing_new() -> None:
    coord = two_members(kafka_fenced=True)
    coord.disconnected("a", now=2.5)
    # b leaves gracefully and releases: its partitions wait rather than go to a.
    out = coord.leave("b", now=2.6)
    released = [_released(lease.tp, lease.epoch) for lease in coord.held_by("b")]
    out = coord.heartbeat("b", [], released, now=2.7)
    assert not grants(out)
    assert all(holder != "b" for holder in holders(coord).values())


def test_a_fresh_grant_is_not_kafka_fenced_until_its_holder_says_so() -> None:
    """The report is per epoch: a grant's lease counts as lease-fenced (waits for its
    expiry) until the new holder's heartbeat under it reports otherwise."""
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    coord.join(member("b"), [], now=0.1)
    coord.disconnected("a", now=0.2)  # before any heartbeat reported anything
    out = coord.disconnect_expired(1.3)
    assert out.disconnected == ["a"] and not grants(out)


def test_a_leaving_member_whose_stream_ends_is_not_disconnected_twice() -> None:
    coord = two_members(kafka_fenced=True)
    coord.leave("a", now=2.1)
    coord.disconnected("a", now=2.2)
    assert coord.members["a"].disconnected_at is None
    out = coord.disconnect_expired(3.5)
    assert not out.disconnected
