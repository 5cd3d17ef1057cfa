"""A join storm's rebalances are coalesced into the tick (Timing.rebalance_interval).

Each rebalance is O(partitions + members) and moves partitions again: N sidecars joining a
large group at once must not cost N of them. Small groups rebalance at once as before.
(That coalescing never puts a partition on two holders is the fencing model's
``test_coalesced_rebalances_keep_one_holder``.)
"""

from __future__ import annotations

from services.assigner.coordinator import COMMITTED, GroupCoordinator, Released, Timing
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.coordinator_support import grants, member, revokes

TIMING = Timing(ttl=3.0, grace=1.0, hold_window=0.0, rebalance_interval=0.1)
LARGE = [TopicPartition("t", p) for p in range(4_000)]  # 4,000+ of work per rebalance
SMALL = [TopicPartition("t", p) for p in range(6)]


def test_a_join_storm_to_a_large_group_rebalances_once_per_tick() -> None:
    coord = GroupCoordinator("g", LARGE, TIMING)
    first = coord.join(member("a"), [], now=0.0)
    assert len(grants(first)) == len(LARGE), "the first event of an interval runs at once"
    second = coord.join(member("b"), [], now=0.01)
    assert len(revokes(second)) == len(LARGE) // 2, "within the work budget: at once"
    # Past the budget: these joins only mark a rebalance pending.
    storm = [coord.join(member(f"m{i:02d}"), [], now=0.02 + i * 0.001) for i in range(18)]
    assert all(out.commands == [] for out in storm)
    # The next tick runs one rebalance for all 20 members: 200 partitions each.
    tick = coord.disconnect_expired(now=0.1)
    intended = coord._intended_counts()
    assert sorted(intended.values()) == [200] * 20
    assert {r.member for r in revokes(tick)} == {"a"}  # b holds nothing yet
    # A release hands the partition straight to the next holder the tick chose.
    r = revokes(tick)[0]
    out = coord.heartbeat(r.member, [], [Released(r.tp, r.epoch, committed=7)], now=0.11)
    assert [(g.tp, g.start_offset) for g in grants(out)] == [(r.tp, COMMITTED)]


def test_a_small_group_rebalances_on_every_event_as_before() -> None:
    coalescing = GroupCoordinator("g", SMALL, TIMING)
    immediate = GroupCoordinator("g", SMALL, Timing(ttl=3.0, grace=1.0, hold_window=0.0))
    for m in "abcdef":
        outs = [c.join(member(m), [], now=0.0) for c in (coalescing, immediate)]
        assert outs[0].commands == outs[1].commands
    assert revokes(outs[0]), "the last join moved a partition at once"


def test_without_an_interval_every_event_rebalances() -> None:
    coord = GroupCoordinator("g", LARGE, Timing(ttl=3.0, grace=1.0, hold_window=0.0))
    coord.join(member("a"), [], now=0.0)
    for i in range(5):
        out = coord.join(member(f"m{i}"), [], now=0.0)
        assert revokes(out), "each join moves partitions at once"
