"""The coordinator's operator operations: offset-reset pauses, drains, mode switches.

Scenarios for each rule, and a property over random histories mixing them with joins,
heartbeats, releases, leaves and ticks: the fencing rule of ARCHITECTURE §3.1.4 holds (a
partition is granted only after its previous holder released it or its lease expired),
epochs only grow, a paused partition is granted to nobody until its reset resumes it, and
then to the member it was reserved for under the reset's epoch, and a drained member is
granted nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from services.assigner.coordinator import (
    COMMITTED,
    GroupCoordinator,
    HeldLease,
    LeaseState,
    Outcome,
    Progress,
    Released,
    RevokeCmd,
    RevokeWhy,
    Timing,
)
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.coordinator_support import grants, holders, member, revokes

TIMING = Timing(ttl=3.0, grace=1.0, hold_window=0.0)
TPS = [TopicPartition("t", p) for p in range(6)]


def released(revoked: list[RevokeCmd], committed: int = 10) -> list[Released]:
    return [Released(r.tp, r.epoch, committed) for r in revoked]


def pair() -> GroupCoordinator:
    """a and b hold three partitions each (epoch 1 for a's, 2 for those b took over)."""
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    moving = revokes(coord.join(member("b"), [], now=0.0))
    coord.heartbeat("a", [], released(moving), now=0.1)
    return coord


# ---- offset resets ------------------------------------------------------------------------


def test_a_reset_pauses_revokes_without_drain_and_gives_back_to_the_same_holder() -> None:
    coord = pair()
    before = holders(coord)
    epochs = {tp: lease.epoch for tp, lease in coord.leases.items()}
    out = coord.pause(TPS, now=1.0)
    assert sorted(r.tp for r in revokes(out)) == TPS
    assert {r.reason for r in revokes(out)} == {RevokeWhy.RESET}
    assert all(r.member == before[r.tp] for r in revokes(out))
    assert not coord.is_paused(TPS)

    for mid in ("a", "b"):
        mine = [r for r in revokes(out) if r.member == mid]
        assert grants(coord.heartbeat(mid, [], released(mine, 55), now=1.1)) == []
    assert coord.is_paused(TPS)
    assert all(lease.state is LeaseState.FREE for lease in coord.leases.values())
    assert grants(coord.disconnect_expired(now=1.2)) == [], "nothing is granted while paused"

    new_epochs = coord.reset_epochs(TPS)
    assert new_epochs == {tp: epochs[tp] + 1 for tp in TPS}
    back = grants(coord.resume(dict.fromkeys(TPS, 7), now=1.3))
    assert sorted(g.tp for g in back) == TPS
    for g in back:
        assert (g.member, g.epoch, g.start_offset) == (before[g.tp], new_epochs[g.tp], 7)
    assert holders(coord) == before, "a reset moves no partition"
    assert coord.paused == {}


def test_a_holder_that_does_not_release_is_waited_out_until_its_lease_expires() -> None:
    coord = pair()

    def heartbeats(now: float) -> None:
        for mid in ("a", "b"):
            mine = [Progress(tp, le.epoch) for tp, le in coord.leases.items() if le.holder == mid]
            coord.heartbeat(mid, mine, [], now)

    heartbeats(1.0)
    a_parts = [tp for tp, h in holders(coord).items() if h == "a"]
    coord.pause(a_parts, now=1.5)
    heartbeats(4.5)  # a lives on but ignores the revoke: its paused leases are not renewed
    assert not coord.is_paused(a_parts)
    assert coord.disconnect_expired(now=4.9).expired == [], "valid until 1.0 + 3 + 1"
    out = coord.disconnect_expired(now=5.1)
    assert sorted(out.expired) == a_parts and grants(out) == []
    assert coord.is_paused(a_parts)
    coord.reset_epochs(a_parts)
    back = grants(coord.resume(dict.fromkeys(a_parts, 0), now=5.2))
    assert {g.member for g in back} == {"a"} and sorted(g.tp for g in back) == a_parts


def test_a_newcomer_gets_no_paused_partition_until_the_reset_is_done() -> None:
    coord = pair()
    out = coord.pause(TPS[:2], now=1.0)
    coord.heartbeat(revokes(out)[0].member, [], released(revokes(out)[:1]), now=1.1)
    coord.heartbeat(revokes(out)[1].member, [], released(revokes(out)[1:]), now=1.1)
    joined = coord.join(member("c"), [], now=1.2)
    assert not {g.tp for g in grants(joined)} & set(TPS[:2])
    assert not {r.tp for r in revokes(joined)} & set(TPS[:2])


def test_a_called_off_reset_grants_again_at_the_committed_offset() -> None:
    coord = pair()
    out = coord.pause(TPS[:1], now=1.0)
    holder = revokes(out)[0].member
    coord.heartbeat(holder, [], released(revokes(out), 33), now=1.1)
    epoch = coord.leases[TPS[0]].epoch
    (again,) = grants(coord.unpause(TPS[:1], now=1.2))
    assert again.epoch == epoch + 1 and again.start_offset == COMMITTED, "what Kafka holds"


def test_a_rejoin_claiming_a_paused_lease_is_fenced() -> None:
    coord = pair()
    out = coord.pause(TPS[:1], now=1.0)
    (revoke,) = revokes(out)
    coord.heartbeat(revoke.member, [], released([revoke]), now=1.1)
    back = coord.join(member(revoke.member), [HeldLease(TPS[0], revoke.epoch)], now=1.2)
    assert [(r.tp, r.reason) for r in revokes(back)] == [(TPS[0], RevokeWhy.FENCED)]
    assert coord.leases[TPS[0]].holder is None


def test_a_paused_partition_cannot_be_moved() -> None:
    coord = pair()
    coord.pause(TPS[:1], now=1.0)
    assert coord.move(TPS[0], "b" if holders(coord)[TPS[0]] == "a" else "a", 1.1).commands == []


# ---- drains -------------------------------------------------------------------------------


def test_a_drained_member_hands_everything_off_and_gets_its_share_back_when_undrained() -> None:
    coord = pair()
    coord.join(member("c"), [], now=0.2)
    for mid in ("a", "b"):
        mine = [lease for lease in coord.leases.values()
                if lease.holder == mid and lease.state is LeaseState.REVOKING]  # fmt: skip
        coord.heartbeat(mid, [], [Released(le.tp, le.epoch, 1) for le in mine], now=0.3)
    assert sorted(sum(1 for h in holders(coord).values() if h == m) for m in "abc") == [2, 2, 2]

    out = coord.set_drained("a", True, now=1.0)
    moving = revokes(out)
    assert {r.member for r in moving} == {"a"} and len(moving) == 2
    handed = grants(coord.heartbeat("a", [], released(moving), now=1.1))
    assert {g.member for g in handed} <= {"b", "c"} and len(handed) == 2
    assert "a" not in holders(coord).values()
    assert sorted(sum(1 for h in holders(coord).values() if h == m) for m in "bc") == [3, 3]
    assert grants(coord.disconnect_expired(now=1.2)) == []

    out = coord.set_drained("a", False, now=2.0)
    assert len(revokes(out)) == 2 and {r.member for r in revokes(out)} <= {"b", "c"}
    for r in revokes(out):
        (g,) = grants(coord.heartbeat(r.member, [], released([r]), now=2.1))
        assert g.member == "a"
    assert sorted(sum(1 for h in holders(coord).values() if h == m) for m in "abc") == [2, 2, 2]


# ---- mode switches ------------------------------------------------------------------------


def test_stop_granting_revokes_everything_and_start_granting_starts_at_the_commits() -> None:
    coord = pair()
    out = coord.stop_granting(now=1.0)
    assert sorted(r.tp for r in revokes(out)) == TPS
    assert {r.reason for r in revokes(out)} == {RevokeWhy.CONFIG}
    for mid in ("a", "b"):
        mine = [r for r in revokes(out) if r.member == mid]
        assert grants(coord.heartbeat(mid, [], released(mine, 90), now=1.1)) == []
    assert coord.unheld()
    assert grants(coord.join(member("c"), [], now=1.2)) == [], "kafka_group: no grants"

    out = coord.start_granting(now=5.0)
    assert sorted(g.tp for g in grants(out)) == TPS
    assert {g.start_offset for g in grants(out)} == {COMMITTED}, "what Kafka has, not ours"


# ---- property: random histories with operations -------------------------------------------

MEMBERS = ["a", "b", "c"]


@dataclass
class Model:
    holder: dict[TopicPartition, tuple[str, int]] = field(default_factory=dict)
    renewed_at: dict[TopicPartition, float] = field(default_factory=dict)
    released: set[TopicPartition] = field(default_factory=set)
    epoch: dict[TopicPartition, int] = field(default_factory=dict)
    reset_epoch: dict[TopicPartition, int] = field(default_factory=dict)
    reserved: dict[TopicPartition, str | None] = field(default_factory=dict)

    def observe(self, coord: GroupCoordinator, out: Outcome, now: float, resumed: bool) -> None:
        for h in out.renewed:
            if self.holder.get(h.tp, ("", -1))[1] == h.epoch:
                self.renewed_at[h.tp] = now
        for g in grants(out):
            previous = self.holder.get(g.tp)
            if previous is not None and g.tp not in self.released:
                expiry = self.renewed_at[g.tp] + TIMING.ttl + TIMING.grace
                assert now > expiry, f"{g.tp} granted at {now}, {previous} valid until {expiry}"
            assert g.tp not in coord.paused, "a paused partition was granted"
            assert g.member not in coord.drained, "a drained member was granted"
            if g.tp in self.reset_epoch:
                # Granted back under the reset's epoch to the member it was reserved for, by
                # the resume itself; or (that member cannot take it) under a newer one.
                epoch = self.reset_epoch.pop(g.tp)
                assert g.epoch >= epoch
                if g.epoch == epoch:
                    assert resumed and g.member == self.reserved[g.tp]
            else:
                assert g.epoch > self.epoch.get(g.tp, 0), "epochs must grow"
            self.epoch[g.tp] = g.epoch
            self.holder[g.tp] = (g.member, g.epoch)
            self.renewed_at[g.tp] = now
            self.released.discard(g.tp)


kinds = st.sampled_from(["join", "heartbeat", "release", "leave", "tick"])
operation = st.one_of(
    st.tuples(kinds, st.sampled_from(MEMBERS)),
    st.tuples(st.just("pause"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("resume"), st.sampled_from(MEMBERS)),
    st.tuples(st.sampled_from(["drain", "undrain"]), st.sampled_from(MEMBERS)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(operation, st.floats(min_value=0.0, max_value=2.5)), max_size=60))
def test_operations_never_break_fencing(history: list[tuple[tuple[str, str], float]]) -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    model = Model()
    now = 0.0
    for (op, mid), step in history:
        now += step
        resumed = False
        if op == "join":
            held = [HeldLease(tp, le.epoch) for tp, le in coord.leases.items() if le.holder == mid]
            out = coord.join(member(mid), held, now)
        elif op == "heartbeat":
            progress = [Progress(tp, le.epoch) for tp, le in coord.leases.items()
                        if le.holder == mid]  # fmt: skip
            out = coord.heartbeat(mid, progress, [], now)
        elif op == "release":
            gone = [Released(tp, le.epoch, 0) for tp, le in coord.leases.items()
                    if le.holder == mid and le.state is LeaseState.REVOKING]  # fmt: skip
            out = coord.heartbeat(mid, [], gone, now)
            for r in gone:
                if model.holder.get(r.tp) == (mid, r.epoch):
                    model.released.add(r.tp)
        elif op == "leave":
            out = coord.leave(mid, now)
        elif op == "pause":
            out = coord.pause(TPS[: 1 + MEMBERS.index(mid) * 2], now)
        elif op == "resume":
            ready = [tp for tp in coord.paused if coord.is_paused([tp])]
            if ready:
                model.reserved.update({tp: coord.paused[tp] for tp in ready})
                model.reset_epoch.update(coord.reset_epochs(ready))
                model.epoch.update(model.reset_epoch)
            out = coord.resume(dict.fromkeys(ready, 5), now)
            resumed = True
        elif op in ("drain", "undrain"):
            out = coord.set_drained(mid, op == "drain", now)
        else:
            out = coord.disconnect_expired(now)
        model.observe(coord, out, now, resumed)
        for lease in coord.leases.values():
            if lease.holder is not None:
                assert lease.state is not LeaseState.FREE
            assert lease.epoch == model.epoch.get(lease.tp, 0)
