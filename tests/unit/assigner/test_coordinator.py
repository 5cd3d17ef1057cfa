"""The group coordinator's rules, as scenarios and as a property over random histories.

The safety property (ARCHITECTURE §3.1.4): a partition is granted to a new holder only
after the previous holder released it (same epoch) or after its lease expired — its last
renewal + TTL + grace lies in the past. Epochs only grow.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from services.assigner.balancer import Strategy
from services.assigner.coordinator import (
    COMMITTED,
    GroupCoordinator,
    HeldLease,
    HoldMode,
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
# RESERVE asked for by name (HANDOFF is the default; its scenarios are in
# test_coordinator_handoff_hold.py): the hold tests below are RESERVE's behaviour.
HOLD = Timing(ttl=3.0, grace=1.0, hold_window=10.0, hold_mode=HoldMode.RESERVE)
HANDOFF_HOLD = Timing(ttl=3.0, grace=1.0, hold_window=10.0)  # the default hold mode
TPS = [TopicPartition("t", p) for p in range(6)]


def test_first_member_gets_every_partition_with_epoch_one() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    out = coord.join(member("a"), [], now=0.0)
    assert sorted(g.tp for g in grants(out)) == TPS
    assert all(g.epoch == 1 and g.start_offset == COMMITTED for g in grants(out))


def test_second_member_gets_half_through_revoke_then_release() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    out = coord.join(member("b"), [], now=1.0)
    assert grants(out) == [], "nothing is granted before the holder releases"
    moving = revokes(out)
    assert len(moving) == 3 and all(r.member == "a" for r in moving)

    released = [Released(r.tp, r.epoch, committed=40 + r.tp.partition) for r in moving]
    out = coord.heartbeat("a", [], released, now=1.5)
    handed = grants(out)
    assert sorted(g.tp for g in handed) == sorted(r.tp for r in moving)
    for g in handed:
        # The release's offset is the holder's word: b starts at what Kafka holds.
        assert g.member == "b" and g.epoch == 2 and g.start_offset == COMMITTED


def test_heartbeat_renews_only_current_epoch_of_granted_leases() -> None:
    coord = GroupCoordinator("g", TPS[:2], TIMING)
    coord.join(member("a"), [], now=0.0)
    progress = [Progress(TPS[0], 1), Progress(TPS[1], 99)]
    out = coord.heartbeat("a", progress, [], now=2.0)
    assert out.renewed == [HeldLease(TPS[0], 1)]
    assert coord.leases[TPS[0]].expires_at == 2.0 + 4.0


def test_silent_member_is_lost_after_ttl_plus_grace_and_partitions_move() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    coord.join(member("b"), [], now=0.0)
    for tp, lease in coord.leases.items():
        holder = lease.holder
        assert holder is not None
        coord.heartbeat(holder, [Progress(tp, lease.epoch)], [], now=0.5)
    # b keeps heartbeating, a goes silent.
    for t in (1.0, 2.0, 3.0, 4.0):
        coord.heartbeat(
            "b",
            [
                Progress(tp, lease.epoch)
                for tp, lease in coord.leases.items()
                if lease.holder == "b"
            ],
            [],
            now=t,
        )
    # The leases being revoked from a were never renewed: they lapse first (at 4.0)...
    early = coord.disconnect_expired(now=4.4)
    assert early.lost == []
    # ...then a itself is lost once its last heartbeat is TTL + grace old.
    out = coord.disconnect_expired(now=4.6)
    assert out.lost == ["a"]
    moved = grants(early) + grants(out)
    assert sorted(g.tp for g in moved) == sorted(
        tp for tp, lease in coord.leases.items() if lease.epoch == 2
    )
    assert all(g.member == "b" and g.start_offset == COMMITTED for g in moved)
    assert all(lease.holder == "b" for lease in coord.leases.values())


def test_reattach_with_current_epochs_moves_nothing() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    for r in revokes(coord.join(member("b"), [], now=0.0)):
        coord.heartbeat("a", [], [Released(r.tp, r.epoch, 0)], now=0.1)
    held = [HeldLease(tp, lease.epoch) for tp, lease in coord.leases.items() if lease.holder == "a"]
    before = {tp: (lease.holder, lease.epoch) for tp, lease in coord.leases.items()}
    out = coord.join(member("a"), held, now=1.0)  # stream broke; a re-joins
    assert out.commands == []
    assert sorted(out.renewed, key=lambda h: h.tp) == sorted(held, key=lambda h: h.tp)
    assert {tp: (lease.holder, lease.epoch) for tp, lease in coord.leases.items()} == before


def test_graceful_leave_revokes_everything_and_member_goes_after_release() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    coord.join(member("b"), [], now=0.0)
    out = coord.leave("a", now=1.0)
    assert {r.member for r in revokes(out)} <= {"a"}
    a_held = [lease for lease in coord.leases.values() if lease.holder == "a"]
    assert all(lease.state is LeaseState.REVOKING for lease in a_held)
    out = coord.heartbeat(
        "a", [], [Released(lease.tp, lease.epoch, 7) for lease in a_held], now=1.2
    )
    assert all(g.member == "b" for g in grants(out))
    assert "a" not in coord.members
    assert all(lease.holder == "b" for lease in coord.leases.values())


def test_stale_release_is_ignored() -> None:
    coord = GroupCoordinator("g", TPS[:1], TIMING)
    coord.join(member("a"), [], now=0.0)
    out = coord.heartbeat("a", [], [Released(TPS[0], epoch=0, committed=5)], now=0.5)
    assert out.commands == [] and coord.leases[TPS[0]].holder == "a"


# ---- property: random histories never violate fencing ------------------------------------

MEMBERS = ["a", "b", "c"]


@dataclass
class Model:
    """What the test observes of each partition's leases, to check each new grant."""

    holder: dict[TopicPartition, tuple[str, int]] = field(default_factory=dict)
    renewed_at: dict[TopicPartition, float] = field(default_factory=dict)
    released: set[TopicPartition] = field(default_factory=set)
    epoch: dict[TopicPartition, int] = field(default_factory=dict)

    def observe(self, out: Outcome, now: float) -> None:
        for h in out.renewed:
            if self.holder.get(h.tp, ("", -1))[1] == h.epoch:
                self.renewed_at[h.tp] = now
        for g in grants(out):
            previous = self.holder.get(g.tp)
            if previous is not None and g.tp not in self.released:
                expiry = self.renewed_at[g.tp] + TIMING.ttl + TIMING.grace
                assert now > expiry, (
                    f"{g.tp} granted to {g.member} at {now} while {previous} valid until {expiry}"
                )
            assert g.epoch > self.epoch.get(g.tp, 0), "epochs must grow"
            self.epoch[g.tp] = g.epoch
            self.holder[g.tp] = (g.member, g.epoch)
            self.renewed_at[g.tp] = now
            self.released.discard(g.tp)


operation = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("release_all"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("tick"), st.sampled_from(MEMBERS)),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(operation, st.floats(min_value=0.0, max_value=2.5)), max_size=60),
    st.sampled_from([TIMING, HOLD, HANDOFF_HOLD]),
)
def test_no_grant_while_the_previous_lease_may_be_valid(
    history: list[tuple[tuple[str, str], float]], timing: Timing
) -> None:
    coord = GroupCoordinator("g", TPS, timing)
    model = Model()
    now = 0.0
    for (op, mid), step in history:
        now += step
        if op == "join":
            held = [
                HeldLease(tp, lease.epoch)
                for tp, lease in coord.leases.items()
                if lease.holder == mid
            ]
            out = coord.join(member(mid), held, now)
        elif op == "heartbeat":
            progress = [
                Progress(tp, lease.epoch)
                for tp, lease in coord.leases.items()
                if lease.holder == mid
            ]
            out = coord.heartbeat(mid, progress, [], now)
        elif op == "release_all":
            released = [
                Released(tp, lease.epoch, 0)
                for tp, lease in coord.leases.items()
                if lease.holder == mid and lease.state is LeaseState.REVOKING
            ]
            out = coord.heartbeat(mid, [], released, now)
            for r in released:
                if model.holder.get(r.tp) == (mid, r.epoch):
                    model.released.add(r.tp)
        elif op == "leave":
            out = coord.leave(mid, now)
        else:
            out = coord.disconnect_expired(now)
        model.observe(out, now)
        # Structural invariants after every step.
        for lease in coord.leases.values():
            if lease.holder is not None:
                assert lease.state is not LeaseState.FREE
            assert lease.epoch == model.epoch.get(lease.tp, 0)


# Histories of the tick properties below: every operation and abandons, with their gaps.
histories = st.lists(
    st.tuples(
        st.one_of(operation, st.tuples(st.just("abandon"), st.sampled_from(MEMBERS))),
        st.floats(min_value=0.0, max_value=2.5),
    ),
    max_size=80,
)


def _step(coord: GroupCoordinator, op: str, mid: str, now: float) -> Outcome:
    """One operation of the histories above, on ``coord``."""
    if op == "join":
        held = [
            HeldLease(tp, lease.epoch) for tp, lease in coord.leases.items() if lease.holder == mid
        ]
        return coord.join(member(mid), held, now)
    if op == "heartbeat":
        progress = [
            Progress(tp, lease.epoch) for tp, lease in coord.leases.items() if lease.holder == mid
        ]
        return coord.heartbeat(mid, progress, [], now)
    if op == "release_all":
        released = [
            Released(tp, lease.epoch, 0)
            for tp, lease in coord.leases.items()
            if lease.holder == mid and lease.state is LeaseState.REVOKING
        ]
        return coord.heartbeat(mid, [], released, now)
    if op == "leave":
        return coord.leave(mid, now)
    if op == "abandon":
        return coord.abandon(mid, now)
    return coord.disconnect_expired(now)


@settings(max_examples=500, deadline=None)
@given(
    histories,
    st.sampled_from([TIMING, HOLD, HANDOFF_HOLD]),
)
def test_a_tick_that_skips_its_scan_decides_what_a_full_scan_decides(
    history: list[tuple[tuple[str, str], float]], timing: Timing
) -> None:
    """The tick skips its scan of every member and lease until the earliest deadline; a
    twin that scans on every tick sees the same outcomes and ends in the same state."""
    skipping, scanning = GroupCoordinator("g", TPS, timing), GroupCoordinator("g", TPS, timing)
    now = 0.0
    for (op, mid), step in history:
        # A tick before each event (the twin that scans sees every one).
        for when, what in ((now + step / 2, "tick"), (now + step, op)):
            scanning._scan_at = float("-inf")  # never skips
            assert _step(skipping, what, mid, when) == _step(scanning, what, mid, when), (
                what,
                mid,
                when,
            )
            assert skipping.leases == scanning.leases
            assert skipping.members == scanning.members
        now += step


@settings(max_examples=500, deadline=None)
@given(
    histories,
    st.sampled_from([TIMING, HOLD, HANDOFF_HOLD]),
    st.sampled_from(list(Strategy)),
)
def test_nothing_is_due_before_due_unless_an_input_poked(
    history: list[tuple[tuple[str, str], float]], timing: Timing, strategy: Strategy
) -> None:
    """The assigner ticks at :meth:`GroupCoordinator.due` or when an input calls
    ``on_sooner`` (tick_wake.py), not every 100 ms: a tick any earlier, with no poke since
    the last one, would have decided nothing and changed nothing."""
    coord = GroupCoordinator("g", TPS, timing, strategy=strategy)
    poked = [True]

    def poke() -> None:
        poked[0] = True

    coord.on_sooner = poke
    due = float("-inf")  # as of the last tick: what the loop sleeps until
    now = 0.0
    for (op, mid), step in history:
        for when, what in ((now + step / 2, "tick"), (now + step, op)):
            if what != "tick":
                _step(coord, what, mid, when)
            elif not poked[0] and when < due:
                early = copy.deepcopy(coord)
                early.on_sooner = lambda: None
                assert early.disconnect_expired(when) == Outcome(), (op, mid, when)
                assert early.leases == coord.leases
                assert early.members == coord.members
            else:
                coord.disconnect_expired(when)  # the tick the loop runs
                poked[0] = False
                due = coord.due()
        now += step


def test_an_idle_group_is_due_at_its_earliest_deadline() -> None:
    coord = GroupCoordinator("g", TPS, TIMING)
    coord.join(member("a"), [], now=0.0)
    coord.disconnect_expired(0.1)  # the scan after the grants
    coord.disconnect_expired(0.2)  # quiet: it sets the deadline
    expiry = TIMING.ttl + TIMING.grace
    assert coord.due() == min(lease.expires_at for lease in coord.leases.values())
    assert 0.0 < coord.due() <= expiry
    pokes: list[str] = []
    coord.on_sooner = lambda: pokes.append("poke")
    coord.heartbeat("a", [Progress(tp, 1) for tp in TPS], [], now=1.0)
    assert pokes == []  # a plain heartbeat moves deadlines later: no poke
    coord.leave("a", now=1.5)
    assert pokes and coord.due() == float("-inf")


def test_a_group_without_grants_is_not_due_for_its_pending_rebalance() -> None:
    """kafka_group mode: the balancer never runs, so its pending rebalance is no deadline
    (the loop would tick every 100 ms for ever)."""
    coord = GroupCoordinator("g", TPS, TIMING, grants_enabled=False)
    coord.disconnect_expired(0.0)
    assert coord.due() == float("inf")


# ---- static identity, restart, fencing, moves ------------------------------------------


def _balanced_pair(timing: Timing) -> GroupCoordinator:
    coord = GroupCoordinator("g", TPS, timing)
    coord.join(member("a"), [], now=0.0)
    for r in revokes(coord.join(member("b"), [], now=0.0)):
        coord.heartbeat("a", [], [Released(r.tp, r.epoch, 10)], now=0.1)
    return coord


def test_graceful_restart_within_hold_window_gets_the_same_partitions_back() -> None:
    coord = _balanced_pair(HOLD)
    before = holders(coord)
    a_parts = [tp for tp, h in before.items() if h == "a"]
    out = coord.leave("a", now=1.0)
    assert {r.tp for r in revokes(out)} == set(a_parts)
    out = coord.heartbeat(
        "a", [], [Released(tp, coord.leases[tp].epoch, 20) for tp in a_parts], now=1.1
    )
    assert grants(out) == [], "nothing moves to b while a's place is held"
    assert coord.reserved_for("a") == a_parts
    for t in (2.0, 5.0, 9.0):
        assert grants(coord.disconnect_expired(now=t)) == []
        coord.heartbeat(
            "b",
            [Progress(tp, coord.leases[tp].epoch) for tp, h in before.items() if h == "b"],
            [],
            now=t,
        )
    out = coord.join(member("a"), [], now=9.5)
    assert sorted(g.tp for g in grants(out)) == a_parts
    assert all(g.member == "a" and g.start_offset == COMMITTED for g in grants(out))
    assert holders(coord) == before
    assert revokes(out) == []


def test_hold_window_expiry_moves_the_partitions_to_the_others() -> None:
    coord = _balanced_pair(HOLD)
    a_parts = [tp for tp, lease in coord.leases.items() if lease.holder == "a"]
    coord.leave("a", now=1.0)
    coord.heartbeat("a", [], [Released(tp, coord.leases[tp].epoch, 20) for tp in a_parts], now=1.1)
    b_parts = [tp for tp, lease in coord.leases.items() if lease.holder == "b"]
    for t in (3.0, 6.0, 9.0):
        coord.heartbeat("b", [Progress(tp, coord.leases[tp].epoch) for tp in b_parts], [], now=t)
    out = coord.disconnect_expired(now=11.2)
    assert out.held_expired == ["a"]
    assert sorted(g.tp for g in grants(out)) == a_parts
    assert all(lease.holder == "b" for lease in coord.leases.values())


def test_restart_adopts_reattached_leases_and_moves_nothing() -> None:
    epochs = {tp: 3 for tp in TPS}
    coord = GroupCoordinator("g", TPS, TIMING, epochs=epochs, settle_until=4.0)
    a_held = [HeldLease(tp, 3) for tp in TPS[:3]]
    b_held = [HeldLease(tp, 3) for tp in TPS[3:]]
    out_a = coord.join(member("a"), a_held, now=0.5)
    assert out_a.commands == [] and len(out_a.renewed) == 3
    out_b = coord.join(member("b"), b_held, now=1.5)
    assert out_b.commands == [] and len(out_b.renewed) == 3
    coord.heartbeat("a", [Progress(h.tp, 3) for h in a_held], [], now=3.5)
    coord.heartbeat("b", [Progress(h.tp, 3) for h in b_held], [], now=3.5)
    out = coord.disconnect_expired(now=4.5)
    assert out.commands == []
    assert {tp: (lease.holder, lease.epoch) for tp, lease in coord.leases.items()} == {
        **{h.tp: ("a", 3) for h in a_held},
        **{h.tp: ("b", 3) for h in b_held},
    }


def test_restart_grants_unclaimed_partitions_only_after_settling() -> None:
    coord = GroupCoordinator("g", TPS, TIMING, epochs={tp: 5 for tp in TPS}, settle_until=4.0)
    assert coord.join(member("a"), [HeldLease(TPS[0], 5)], now=0.5).commands == []
    assert coord.disconnect_expired(now=3.9).commands == []
    coord.heartbeat("a", [Progress(TPS[0], 5)], [], now=3.9)
    out = coord.disconnect_expired(now=4.1)
    assert sorted(g.tp for g in grants(out)) == TPS[1:]
    assert all(g.epoch == 6 for g in grants(out)), "epochs continue from durable state"


def test_stale_epoch_on_reattach_is_fenced() -> None:
    coord = GroupCoordinator("g", TPS[:1], TIMING, epochs={TPS[0]: 7}, settle_until=0.0)
    out = coord.join(member("z"), [HeldLease(TPS[0], 6)], now=1.0)
    fenced = [r for r in revokes(out) if r.reason is RevokeWhy.FENCED]
    assert fenced == [RevokeCmd("z", TPS[0], 6, RevokeWhy.FENCED)]


def test_move_swaps_to_keep_the_count_balance() -> None:
    coord = _balanced_pair(TIMING)
    tp = next(tp for tp, lease in coord.leases.items() if lease.holder == "a")
    out = coord.move(tp, "b", now=1.0)
    moved = revokes(out)
    assert [r.reason for r in moved] == [RevokeWhy.MOVE, RevokeWhy.MOVE]
    assert {r.member for r in moved} == {"a", "b"}
    for r in moved:
        coord.heartbeat(r.member, [], [Released(r.tp, r.epoch, 0)], now=1.2)
    assert coord.leases[tp].holder == "b"
    counts = {m: sum(1 for lease in coord.leases.values() if lease.holder == m) for m in "ab"}
    assert counts == {"a": 3, "b": 3}
    assert coord.disconnect_expired(now=1.3).commands == [], "the balancer undoes nothing"


def test_load_mode_spreads_heavy_partitions() -> None:
    from services.assigner.balancer import Strategy
    from services.assigner.coordinator import partition_weight

    tps = [TopicPartition("t", p) for p in range(8)]
    coord = GroupCoordinator("g", tps, TIMING, strategy=Strategy.LOAD)
    coord.join(member("a"), [], now=0.0)
    # a reports two very heavy partitions and six light ones.
    heavy = {tps[0], tps[1]}
    progress = [
        Progress(tp, 1, bytes_per_second=1_000_000.0 if tp in heavy else 1_000.0) for tp in tps
    ]
    coord.heartbeat("a", progress, [], now=0.5)
    out = coord.join(member("b"), [], now=1.0)
    moved = {r.tp for r in revokes(out)}
    assert len(moved & heavy) == 1, "b must take one of the two heavy partitions"
    assert partition_weight(100.0, 10_000) == 200.0
    assert partition_weight(100.0, -1) == 100.0


def test_kafka_group_mode_tracks_members_but_never_grants() -> None:
    coord = GroupCoordinator("g", TPS, TIMING, grants_enabled=False)
    out = coord.join(member("a"), [HeldLease(TPS[0], 0)], now=0.0)
    assert out.commands == [] and out.renewed == []
    assert coord.join(member("b"), [], now=0.1).commands == []
    assert [m.id for m in coord.live_members()] == ["a", "b"]
    assert coord.disconnect_expired(now=1.0).commands == []
    assert all(lease.holder is None for lease in coord.leases.values())
