"""Hold mode HANDOFF (pure): a gracefully-left member's partitions go to the others at once
and come back to it, by cooperative handoffs, when it returns within its hold window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.assigner.coordinator import (
    COMMITTED,
    GroupCoordinator,
    HoldMode,
    Outcome,
    Progress,
    Released,
    Timing,
)
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.coordinator_support import grants, holders, member, revokes

HANDOFF = Timing(ttl=3.0, grace=1.0, hold_window=10.0, hold_mode=HoldMode.HANDOFF)
TPS = [TopicPartition("t", p) for p in range(6)]


def release_all(coord: GroupCoordinator, out: Outcome, now: float) -> Outcome:
    """Each revoked holder releases at once (committed offset 20); what that produced."""
    result = Outcome()
    for r in revokes(out):
        step = coord.heartbeat(r.member, [], [Released(r.tp, r.epoch, 20)], now=now)
        result.commands += step.commands
    return result


def balanced(members: list[str]) -> GroupCoordinator:
    coord = GroupCoordinator("g", TPS, HANDOFF)
    for mid in members:
        release_all(coord, coord.join(member(mid), [], now=0.0), now=0.1)
    return coord


def test_a_leaving_members_partitions_go_to_the_others_at_once() -> None:
    coord = balanced(["a", "b", "c"])
    a_parts = sorted(tp for tp, h in holders(coord).items() if h == "a")
    out = coord.leave("a", now=1.0)
    assert sorted(r.tp for r in revokes(out)) == a_parts
    handed = release_all(coord, out, now=1.1)
    # Granted in the same step as the release: nobody waits for the hold window.
    assert sorted(g.tp for g in grants(handed)) == a_parts
    assert {g.member for g in grants(handed)} <= {"b", "c"}
    assert all(g.start_offset == COMMITTED for g in grants(handed))
    assert coord.reserved_for("a") == []
    counts = sorted(list(holders(coord).values()).count(m) for m in ("b", "c"))
    assert counts == [3, 3]


def test_a_member_back_within_its_window_gets_exactly_its_partitions_back() -> None:
    coord = balanced(["a", "b", "c"])
    before = holders(coord)
    a_parts = sorted(tp for tp, h in before.items() if h == "a")
    release_all(coord, coord.leave("a", now=1.0), now=1.1)
    for t in (2.0, 4.0):  # the others renew what they hold
        for mid in ("b", "c"):
            progress = [Progress(ls.tp, ls.epoch) for ls in coord.held_by(mid)]
            coord.heartbeat(mid, progress, [], now=t)
    out = coord.join(member("a"), [], now=5.0)
    # Taken back cooperatively: the interim holders are asked to release, nothing is
    # granted to a before its holder released (no two holders).
    assert sorted(r.tp for r in revokes(out)) == a_parts
    assert grants(out) == []
    back = release_all(coord, out, now=5.1)
    assert sorted(g.tp for g in grants(back)) == a_parts
    assert all(g.member == "a" and g.start_offset == COMMITTED for g in grants(back))
    assert holders(coord) == before


def test_the_window_ending_moves_nothing_more() -> None:
    coord = balanced(["a", "b"])
    release_all(coord, coord.leave("a", now=1.0), now=1.1)
    after_leave = holders(coord)
    assert set(after_leave.values()) == {"b"}
    for t in (3.0, 6.0, 9.0):
        coord.heartbeat("b", [Progress(ls.tp, ls.epoch) for ls in coord.held_by("b")], [], t)
    out = coord.disconnect_expired(now=11.2)
    assert out.held_expired == ["a"]
    assert out.commands == []
    assert holders(coord) == after_leave
    # Returning after its window, a is a new member: the balancer gives it a fair share.
    out = coord.join(member("a"), [], now=12.0)
    assert len(revokes(out)) == 3


def test_a_drained_member_coming_back_gets_nothing_back() -> None:
    coord = balanced(["a", "b"])
    release_all(coord, coord.leave("a", now=1.0), now=1.1)
    coord.drained.add("a")
    out = coord.join(member("a"), [], now=2.0)
    assert revokes(out) == [] and grants(out) == []


@settings(max_examples=60, deadline=None)
@given(
    n_members=st.integers(2, 5),
    leaver=st.integers(0, 4),
    returns=st.booleans(),
)
def test_never_two_holders_and_every_partition_held_after_leave_and_return(
    n_members: int, leaver: int, returns: bool
) -> None:
    ids = [f"m{i}" for i in range(n_members)]
    gone = ids[leaver % n_members]
    coord = balanced(ids)
    before = holders(coord)
    out = coord.leave(gone, now=1.0)
    pending = release_all(coord, out, now=1.1)
    while revokes(pending):
        pending = release_all(coord, pending, now=1.2)
    assert all(h is not None and h != gone for h in holders(coord).values())
    if returns:
        pending = coord.join(member(gone), [], now=3.0)
        while revokes(pending):
            pending = release_all(coord, pending, now=3.1)
        assert holders(coord) == before
    assert all(lease.holder is not None for lease in coord.leases.values())
