"""Property tests of the partition balancer (ARCHITECTURE §3 "Balance", §5.1).

Balance bound, capacity, exactly-once ownership, stickiness, minimal movement on join and
leave (checked against a brute-force oracle), determinism, zone preference and the LOAD
bound, plus worked examples of the scenarios the design promises.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from services.assigner.balancer import (
    LOAD_TOLERANCE,
    BalanceInput,
    BalanceResult,
    Member,
    Move,
    Strategy,
    movement_lower_bound,
    rebalance,
)
from services.runtime.topic_partition import TopicPartition

PROPERTY = settings(max_examples=500, deadline=None)
ZONES = ["z0", "z1", "z2"]
DEPARTED = ["gone0", "gone1"]
T = TypeVar("T")


def tps(n: int, topic: str = "t") -> list[TopicPartition]:
    return [TopicPartition(topic, i) for i in range(n)]


# --- strategies ------------------------------------------------------------------------

# Per-partition details come from one drawn seed: hypothesis-drawn randoms cost ~10 ms an
# example, a seeded random.Random nothing (and the seed still shrinks and replays).
RANDOMS = st.integers(0, 2**32 - 1).map(random.Random)


def random_zones(rnd: random.Random, partitions: list[TopicPartition]) -> dict[TopicPartition, str]:
    return {tp: z for tp in partitions if (z := rnd.choice([None, *ZONES])) is not None}


@st.composite
def partition_lists(draw: st.DrawFn, max_per_topic: int = 12) -> list[TopicPartition]:
    sizes = draw(st.lists(st.integers(0, max_per_topic), min_size=1, max_size=3))
    return [tp for i, n in enumerate(sizes) for tp in tps(n, f"topic{i}")]


def member_ids(max_members: int = 7, min_members: int = 0) -> st.SearchStrategy[list[str]]:
    pool = st.sampled_from([f"m{i}" for i in range(10)])
    return st.lists(pool, unique=True, min_size=min_members, max_size=max_members)


def make_members(ids: list[str], rnd: random.Random, capacities: bool = True) -> list[Member]:
    """Half the members unlimited, the others capped at 0..10 (when capacities); any zone."""
    return [
        Member(
            i,
            rnd.choice([None, rnd.randint(0, 10)]) if capacities else None,
            rnd.choice([None, *ZONES]),
        )
        for i in ids
    ]


@st.composite
def count_inputs(draw: st.DrawFn, max_members: int = 7, max_per_topic: int = 12) -> BalanceInput:
    partitions = draw(partition_lists(max_per_topic))
    ids = draw(member_ids(max_members))
    rnd = draw(RANDOMS)
    members = make_members(ids, rnd)
    holders = [None, *(m.id for m in members), *DEPARTED]
    current = {tp: h for tp in partitions if (h := rnd.choice(holders)) is not None}
    return BalanceInput(partitions, members, current, partition_zones=random_zones(rnd, partitions))


@st.composite
def balanced_states(draw: st.DrawFn, min_members: int = 1) -> BalanceInput:
    """An independently built balanced assignment: uncapped members, every partition held."""
    partitions = draw(partition_lists())
    ids = draw(member_ids(6, min_members))
    rnd = draw(RANDOMS)
    members = make_members(ids, rnd, capacities=False)
    n, m = len(partitions), len(members)
    big = set(rnd.sample(range(m), n % m))
    quotas = [n // m + (i in big) for i in range(m)]
    dealt = rnd.sample(partitions, n)
    current: dict[TopicPartition, str] = {}
    start = 0
    for member, quota in zip(members, quotas, strict=True):
        current.update(dict.fromkeys(dealt[start : start + quota], member.id))
        start += quota
    return BalanceInput(partitions, members, current, partition_zones=random_zones(rnd, partitions))


# --- checks ----------------------------------------------------------------------------


def counts_of(inp: BalanceInput, assignment: Mapping[TopicPartition, str]) -> dict[str, int]:
    held = Counter(assignment.values())
    return {m.id: held[m.id] for m in inp.members}


def capacity_of(member: Member) -> float:
    return math.inf if member.capacity is None else member.capacity


def is_count_balanced(members: Sequence[Member], counts: Mapping[str, int]) -> bool:
    """max - min <= 1 over members below capacity; nobody above capacity or above that band."""
    if any(counts[m.id] > capacity_of(m) for m in members):
        return False
    below_capacity = [counts[m.id] for m in members if counts[m.id] < capacity_of(m)]
    if not below_capacity:
        return True
    return max(counts.values()) - min(below_capacity) <= 1


def assert_ownership(inp: BalanceInput, res: BalanceResult) -> None:
    live = {m.id for m in inp.members}
    assert set(res.assignment.values()) <= live
    assert set(res.assignment).isdisjoint(res.unassigned)
    assert set(res.assignment) | set(res.unassigned) == set(inp.partitions)
    assert len(res.unassigned) == len(set(res.unassigned))
    total_capacity = sum(capacity_of(m) for m in inp.members)
    n = len(set(inp.partitions))
    assert len(res.unassigned) == max(0, n - total_capacity)


def assert_moves_match(inp: BalanceInput, res: BalanceResult) -> None:
    live = {m.id for m in inp.members}
    expected = []
    for tp in sorted(set(inp.partitions)):
        old, new = inp.current.get(tp), res.assignment.get(tp)
        if new != old and (new is not None or old in live):
            expected.append(Move(tp, old, new))
    assert res.moves == expected


def moved_from_live(inp: BalanceInput, res: BalanceResult) -> int:
    live = {m.id for m in inp.members}
    return sum(1 for move in res.moves if move.source in live)


def oracle_lower_bound(inp: BalanceInput) -> int:
    """Brute force: min over every balanced quota vector of sum(max(0, held - quota)).

    For a level L every balanced vector has each member at L or L + 1 (within capacity) or
    at a capacity below L; a DP over members finds the cheapest vector with the right sum.
    """
    n = len(set(inp.partitions))
    live = {m.id for m in inp.members}
    known = set(inp.partitions)
    held = Counter(h for tp, h in inp.current.items() if h in live and tp in known)
    total = int(min(n, sum(capacity_of(m) for m in inp.members)))
    best = math.inf
    for level in range(n + 1):
        costs: dict[int, float] = {0: 0}
        for m in inp.members:
            cap = capacity_of(m)
            options = {q for q in (level, level + 1) if q <= cap}
            if cap < level:
                options.add(int(cap))
            nxt: dict[int, float] = {}
            for s, c in costs.items():
                for q in options:
                    if s + q <= total:
                        cost = c + max(0, held[m.id] - q)
                        nxt[s + q] = min(nxt.get(s + q, math.inf), cost)
            costs = nxt
        best = min(best, costs.get(total, math.inf))
    assert best < math.inf
    return int(best)


def loads_of(
    inp: BalanceInput, res: BalanceResult, weights: Mapping[TopicPartition, float]
) -> dict[str, float]:
    loads = dict.fromkeys((m.id for m in inp.members), 0.0)
    for tp, member in res.assignment.items():
        loads[member] += weights[tp]
    return loads


# --- COUNT properties --------------------------------------------------------------------


@PROPERTY
@given(count_inputs())
def test_count_balance_capacity_and_ownership(inp: BalanceInput) -> None:
    res = rebalance(inp)
    assert_ownership(inp, res)
    assert is_count_balanced(inp.members, counts_of(inp, res.assignment))
    assert_moves_match(inp, res)


@PROPERTY
@given(count_inputs(max_members=6, max_per_topic=10))
def test_moves_from_live_members_are_the_minimum(inp: BalanceInput) -> None:
    res = rebalance(inp)
    bound = movement_lower_bound(inp)
    assert bound == oracle_lower_bound(inp)
    assert moved_from_live(inp, res) == bound
    # Partitions of live members that stay at or below their quota never move.
    counts = counts_of(inp, res.assignment)
    for move in res.moves:
        if move.source in counts:
            assert counts[move.source] < sum(1 for h in inp.current.values() if h == move.source)


@PROPERTY
@given(count_inputs())
def test_result_is_a_fixed_point(inp: BalanceInput) -> None:
    first = rebalance(inp)
    again = rebalance(replace(inp, current=first.assignment))
    assert again.moves == []
    assert again.assignment == first.assignment
    assert movement_lower_bound(replace(inp, current=first.assignment)) == 0


@PROPERTY
@given(balanced_states())
def test_balanced_assignment_is_returned_unchanged(inp: BalanceInput) -> None:
    res = rebalance(inp)
    assert res.moves == []
    assert res.assignment == dict(inp.current)
    assert movement_lower_bound(inp) == 0


@PROPERTY
@given(balanced_states(), st.sampled_from([*ZONES, None]))
def test_single_join_moves_exactly_the_newcomers_quota(
    state: BalanceInput, zone: str | None
) -> None:
    newcomer = Member("new", None, zone)
    inp = replace(state, members=[*state.members, newcomer])
    res = rebalance(inp)
    n, m = len(state.partitions), len(inp.members)
    gained = counts_of(inp, res.assignment)["new"]
    assert gained in {n // m, -(-n // m)}
    assert len(res.moves) == moved_from_live(inp, res) == gained == movement_lower_bound(inp)
    assert all(move.target == "new" for move in res.moves)
    assert is_count_balanced(inp.members, counts_of(inp, res.assignment))


@PROPERTY
@given(balanced_states(min_members=2), st.integers(0, 5))
def test_single_leave_moves_only_the_leavers_partitions(state: BalanceInput, index: int) -> None:
    leaver = state.members[index % len(state.members)]
    inp = replace(state, members=[m for m in state.members if m != leaver])
    res = rebalance(inp)
    leavers_partitions = sorted(tp for tp, h in state.current.items() if h == leaver.id)
    assert [move.partition for move in res.moves] == leavers_partitions
    assert all(move.source == leaver.id for move in res.moves)
    assert moved_from_live(inp, res) == movement_lower_bound(inp) == 0
    assert is_count_balanced(inp.members, counts_of(inp, res.assignment))


def shuffled(inp: BalanceInput, rnd: random.Random) -> BalanceInput:
    def mix(items: Sequence[T]) -> list[T]:
        out = list(items)
        rnd.shuffle(out)
        return out

    return replace(
        inp,
        partitions=mix(inp.partitions),
        members=mix(inp.members),
        current=dict(mix(list(inp.current.items()))),
        weights=dict(mix(list(inp.weights.items()))),
        partition_zones=dict(mix(list(inp.partition_zones.items()))),
    )


@PROPERTY
@given(count_inputs(), st.sampled_from(Strategy), RANDOMS)
def test_shuffled_input_gives_identical_result(
    inp: BalanceInput, strategy: Strategy, rnd: random.Random
) -> None:
    weights = {tp: float(rnd.randint(0, 9)) for tp in inp.partitions if rnd.random() < 0.8}
    inp = replace(inp, strategy=strategy, weights=weights)
    assert rebalance(shuffled(inp, rnd)) == rebalance(inp)
    assert movement_lower_bound(shuffled(inp, rnd)) == movement_lower_bound(inp)


# --- zones -------------------------------------------------------------------------------


@st.composite
def zone_perfect_fits(draw: st.DrawFn) -> BalanceInput:
    """Zones whose partition counts let a balanced assignment keep every partition home."""
    n_zones = draw(st.integers(1, 3))
    level = draw(st.integers(0, 4))
    members: list[Member] = []
    partitions: list[TopicPartition] = []
    zones: dict[TopicPartition, str] = {}
    for z in range(n_zones):
        size = draw(st.integers(1, 3))
        extra = draw(st.integers(0, size))
        capacity = st.none() | st.just(level + 1)
        members += [Member(f"m{z}-{i}", draw(capacity), f"z{z}") for i in range(size)]
        for tp in tps(size * level + extra, f"topic{z}"):
            partitions.append(tp)
            zones[tp] = f"z{z}"
    ids = draw(st.permutations([m.id for m in members]))  # zone order != id order
    members = [replace(m, id=new) for m, new in zip(members, ids, strict=True)]
    rnd = draw(RANDOMS)
    stale = {tp: h for tp in partitions if (h := rnd.choice([None, *DEPARTED])) is not None}
    return BalanceInput(partitions, members, stale, partition_zones=zones)


@PROPERTY
@given(zone_perfect_fits())
def test_fresh_assignment_keeps_every_partition_in_zone_when_zones_fit(inp: BalanceInput) -> None:
    res = rebalance(inp)
    zone_of = {m.id: m.zone for m in inp.members}
    assert res.unassigned == []
    assert all(zone_of[h] == inp.partition_zones[tp] for tp, h in res.assignment.items())
    assert is_count_balanced(inp.members, counts_of(inp, res.assignment))


@PROPERTY
@given(count_inputs())
def test_fresh_assignment_cannot_be_improved_zone_wise(inp: BalanceInput) -> None:
    """No balanced single move and no swap would put more partitions in their zone."""
    inp = replace(inp, current={})
    res = rebalance(inp)
    zone_of = {m.id: m.zone for m in inp.members}
    counts = counts_of(inp, res.assignment)
    misplaced = [  # (partition, holder or None) whose zone has members but is not its holder's
        (tp, res.assignment.get(tp))
        for tp in inp.partitions
        if (z := inp.partition_zones.get(tp)) is not None
        and z in zone_of.values()
        and zone_of.get(res.assignment.get(tp, "")) != z
    ]
    holds_foreign = {
        h for tp, h in res.assignment.items() if inp.partition_zones.get(tp) != zone_of[h]
    }
    tried: set[tuple[str | None, str]] = set()
    for tp, holder in misplaced:
        for m in (m for m in inp.members if m.zone == inp.partition_zones[tp]):
            # swapping tp with an out-of-zone partition of m would gain
            assert m.id not in holds_foreign
            # so would moving tp to m: that must break balance or capacity
            if holder is not None and (holder, m.id) not in tried:
                tried.add((holder, m.id))
                moved = {**counts, holder: counts[holder] - 1, m.id: counts[m.id] + 1}
                assert not is_count_balanced(inp.members, moved)


# --- LOAD --------------------------------------------------------------------------------


@st.composite
def small_weight_loads(draw: st.DrawFn) -> tuple[BalanceInput, dict[TopicPartition, float]]:
    """LOAD inputs where every weight is at most 10 % of the mean member load."""
    ids = draw(member_ids(4, min_members=1))
    rnd = draw(RANDOMS)
    members = make_members(ids, rnd, capacities=False)
    m = len(members)
    heaviest = draw(st.integers(1, 3))
    partitions = tps(draw(st.integers(10 * heaviest * m, 10 * heaviest * m + 40)))
    weights = {tp: float(rnd.randint(1, heaviest)) for tp in partitions}
    assume(max(weights.values()) <= 0.1 * sum(weights.values()) / m)  # holds by construction
    holders = [None, *(x.id for x in members), *DEPARTED]
    current = {tp: h for tp in partitions if (h := rnd.choice(holders)) is not None}
    zones = random_zones(rnd, partitions)
    inp = BalanceInput(partitions, members, current, Strategy.LOAD, weights, zones)
    return inp, weights


@PROPERTY
@given(small_weight_loads())
def test_load_mode_max_within_tolerance_of_mean(
    case: tuple[BalanceInput, dict[TopicPartition, float]],
) -> None:
    inp, weights = case
    res = rebalance(inp)
    assert_ownership(inp, res)
    assert res.unassigned == []
    mean = sum(weights.values()) / len(inp.members)
    bound = (1 + LOAD_TOLERANCE) * mean
    assert max(loads_of(inp, res, weights).values()) <= bound + 1e-9
    assert moved_from_live(inp, res) == movement_lower_bound(inp)
    # Only overloaded members give partitions up.
    live = {m.id for m in inp.members}
    held_live = {tp: h for tp, h in inp.current.items() if h in live}
    before = loads_of(inp, replace(res, assignment=held_live), weights)
    assert all(before[m.source] > bound for m in res.moves if m.source in before)
    # Sticky: a result within tolerance is kept as it is.
    again = rebalance(replace(inp, current=res.assignment))
    assert again.moves == []


@PROPERTY
@given(count_inputs(), RANDOMS)
def test_load_mode_capacity_and_ownership(inp: BalanceInput, rnd: random.Random) -> None:
    """Any weights (giants included, some missing): capacity, ownership, moves accounted."""
    scale = rnd.choice([1.0, 10.0, 100.0])
    weights = {tp: rnd.random() * scale for tp in inp.partitions if rnd.random() < 0.8}
    inp = replace(inp, strategy=Strategy.LOAD, weights=weights)
    res = rebalance(inp)
    assert_ownership(inp, res)
    counts = counts_of(inp, res.assignment)
    assert all(counts[m.id] <= capacity_of(m) for m in inp.members)
    assert_moves_match(inp, res)
    assert moved_from_live(inp, res) == movement_lower_bound(inp)


# --- worked examples ---------------------------------------------------------------------


def grow(partitions: list[TopicPartition], before: int, after: int) -> tuple[int, BalanceResult]:
    """Balance over `before` members, then rebalance over `after`; return moves of the latter."""
    first = rebalance(BalanceInput(partitions, [Member(f"m{i}") for i in range(before)], {}))
    inp = BalanceInput(partitions, [Member(f"m{i}") for i in range(after)], first.assignment)
    res = rebalance(inp)
    return len(res.moves), res


def test_join_2_to_3_with_24_partitions_moves_8() -> None:
    moved, res = grow(tps(24), 2, 3)
    assert moved == 8
    assert Counter(res.assignment.values()) == {"m0": 8, "m1": 8, "m2": 8}
    assert {move.source for move in res.moves} == {"m0", "m1"}


def test_join_3_to_4_with_24_partitions_moves_6() -> None:
    moved, res = grow(tps(24), 3, 4)
    assert moved == 6
    assert all(move.target == "m3" for move in res.moves)


def test_leave_1_of_4_moves_exactly_its_6() -> None:
    moved, res = grow(tps(24), 4, 3)
    assert moved == 6
    assert all(move.source == "m3" for move in res.moves)
    assert Counter(res.assignment.values()) == {"m0": 8, "m1": 8, "m2": 8}


def test_first_assignment_moves_every_partition_from_none() -> None:
    res = rebalance(BalanceInput(tps(5), [Member("b"), Member("a")], {}))
    assert [move.source for move in res.moves] == [None] * 5
    assert Counter(res.assignment.values()) == {"a": 3, "b": 2}  # ties by id


def test_extra_partition_goes_to_the_member_already_holding_it() -> None:
    current = {tp: ("a" if tp.partition < 3 else "b") for tp in tps(5)}
    res = rebalance(BalanceInput(tps(5), [Member("a"), Member("b")], current))
    assert res.moves == []  # b holds 2, a holds 3: a keeps the ceil quota, not "a by id"
    current = {tp: ("b" if tp.partition < 3 else "a") for tp in tps(5)}
    res = rebalance(BalanceInput(tps(5), [Member("a"), Member("b")], current))
    assert res.moves == []


def test_capacity_short_leaves_the_rest_unassigned_and_revokes_over_capacity() -> None:
    members = [Member("a", capacity=2), Member("b", capacity=3)]
    current = dict.fromkeys(tps(10), "a")
    res = rebalance(BalanceInput(tps(10), members, current))
    assert Counter(res.assignment.values()) == {"a": 2, "b": 3}
    assert len(res.unassigned) == 5
    assert sum(1 for move in res.moves if move.target is None) == 5
    assert movement_lower_bound(BalanceInput(tps(10), members, current)) == 8


def test_capped_member_may_hold_fewer() -> None:
    members = [Member("a", capacity=1), Member("b"), Member("c")]
    res = rebalance(BalanceInput(tps(9), members, {}))
    assert Counter(res.assignment.values()) == {"a": 1, "b": 4, "c": 4}


def test_zone_breaks_ties_but_never_stickiness() -> None:
    members = [Member("a", zone="z1"), Member("b", zone="z2")]
    zones = {tp: ("z1" if tp.partition % 2 else "z2") for tp in tps(6)}
    fresh = rebalance(BalanceInput(tps(6), members, {}, partition_zones=zones))
    assert all(fresh.assignment[tp] == ("a" if z == "z1" else "b") for tp, z in zones.items())
    wrong = {tp: ("b" if z == "z1" else "a") for tp, z in zones.items()}
    sticky = rebalance(BalanceInput(tps(6), members, wrong, partition_zones=zones))
    assert sticky.moves == []  # balanced already: zones are no reason to move


def test_static_identity_hold_window() -> None:
    """Keeping a restarting sidecar listed during the hold window moves nothing."""
    members = [Member("pod-0"), Member("pod-1"), Member("pod-2")]
    state = rebalance(BalanceInput(tps(12), members, {})).assignment
    held = rebalance(BalanceInput(tps(12), members, state))
    assert held.moves == []
    dropped = rebalance(BalanceInput(tps(12), members[:2], state))
    assert {move.source for move in dropped.moves} == {"pod-2"}
    assert len(dropped.moves) == 4


def test_load_mode_gives_an_oversized_partition_a_member_of_its_own() -> None:
    partitions = tps(21)
    weights = {tp: (100.0 if tp.partition == 0 else 1.0) for tp in partitions}
    members = [Member("a"), Member("b"), Member("c")]
    current = dict.fromkeys(partitions, "a")
    res = rebalance(BalanceInput(partitions, members, current, Strategy.LOAD, weights))
    loads = loads_of(BalanceInput(partitions, members, current), res, weights)
    assert res.assignment[partitions[0]] == "a"  # the giant stays with its holder, alone
    assert loads == {"a": 100.0, "b": 10.0, "c": 10.0}
    assert len(res.moves) == 20


def test_load_mode_missing_weights_count_as_the_mean() -> None:
    partitions = tps(4)
    weights = {partitions[0]: 3.0, partitions[1]: 1.0}  # the other two weigh 2.0 each
    res = rebalance(
        BalanceInput(partitions, [Member("a"), Member("b")], {}, Strategy.LOAD, weights)
    )
    effective = {**weights, partitions[2]: 2.0, partitions[3]: 2.0}
    loads = loads_of(BalanceInput(partitions, [Member("a"), Member("b")], {}), res, effective)
    assert loads == {"a": 4.0, "b": 4.0}


def test_no_members_leaves_everything_unassigned() -> None:
    res = rebalance(BalanceInput(tps(3), [], {tps(3)[0]: "gone"}))
    assert res.assignment == {}
    assert res.unassigned == tps(3)
    assert res.moves == []


def test_duplicate_member_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate member"):
        rebalance(BalanceInput(tps(3), [Member("a"), Member("a", capacity=1)], {}))


def test_bad_weight_is_rejected() -> None:
    inp = BalanceInput(tps(2), [Member("a")], {}, Strategy.LOAD, {tps(2)[0]: math.nan})
    with pytest.raises(ValueError, match="finite"):
        rebalance(inp)
