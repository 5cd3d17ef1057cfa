"""Which sidecar should hold which partition: the assigner's balancing policy.

A pure module: no I/O, no clock, no randomness, no module state. Same input, same output,
whatever the iteration order of ``members``, ``partitions`` or ``current`` (everything is
sorted internally and every tie is broken by member id / partition).

One call balances one consumer group: ``rebalance(BalanceInput)`` takes the group's
partitions, its live sidecars and who holds what now, and returns the target holder of
every partition plus the moves needed to get there.

COUNT strategy (default; ARCHITECTURE §3 "Balance")
    *Quotas.* Partitions are water-filled over the members: find the highest level ``f``
    with ``sum(min(capacity, f)) <= N``; members whose capacity is at most ``f`` get their
    capacity, the others get ``f``, and the remaining ``R`` partitions add one to ``R`` of
    the members that can take ``f + 1``. So among members not limited by capacity
    max - min <= 1, no member exceeds its capacity, and every partition is owned when the
    total capacity allows (otherwise every member is full and the rest is ``unassigned``).
    The ``+1`` goes first to members that already hold more than ``f`` (each one saves a
    move), by held count then id; leftover ``+1`` slots, which cannot change the number of
    moves, go where they let more partitions land in their zone, then by held count and id.
    *Sticky, minimal movement.* A live member keeps its partitions up to its quota; only the
    surplus of members above quota leaves them (its out-of-zone partitions first). Orphans
    (holder departed, unknown or none) and that surplus are handed to the members below
    quota, in-zone first. The partitions taken away from live members are therefore exactly
    ``sum(max(0, held - quota))``, which is the minimum over every balanced outcome
    (:func:`movement_lower_bound`): on a join only what the newcomer needs to reach its
    quota moves, on a leave only the leaver's partitions move.
    *Zones* (``Member.zone``, ``BalanceInput.partition_zones``) are a soft tie-breaker only:
    they choose among outcomes that are already balanced and minimal, never against them.

LOAD strategy
    Partitions are weighted by ``weights`` (observed cost, e.g. bytes/s plus a lag factor;
    a partition without a weight counts as the mean of the given weights, or 1.0 when none
    are given). The goal is the heaviest member within ``LOAD_TOLERANCE`` (10 %) of the mean
    member load. A partition that alone outweighs that bound cannot meet it: such partitions
    are given a member of their own (preferably their current holder) and the tolerance is
    recomputed over the other members and partitions, repeatedly. Every other member keeps
    its partitions while its load is within the tolerance; an overloaded member sheds the
    fewest partitions that bring it under (the smallest single partition that suffices,
    else its heaviest and repeat), then its lightest ones beyond its capacity. The shed and
    orphaned partitions are then placed heaviest first: on the least-loaded member of their
    zone if that stays within tolerance, else on the least-loaded member overall. When every
    weight is at most ``LOAD_TOLERANCE`` x mean (and capacity does not bind) this
    guarantees max load <= (1 + ``LOAD_TOLERANCE``) x mean (greedy largest-first argument:
    the least-loaded member is always below the mean). Count capacity is honoured; count
    balance is not a goal in this mode. Only the maximum is bounded: no member within the
    bound gives anything up, so a newcomer receives partitions only when some member is
    over the bound or partitions are orphaned.

Static identity (ARCHITECTURE §3 "Static identity")
    Nothing here is special-cased. Under ``hold_mode: reserve``, during the hold window
    after a graceful restart the assigner keeps the departed sidecar *in* ``members`` (with
    its id, capacity and zone) and keeps its partitions in ``current`` under that id; the
    balancer then treats it as live, so its partitions stay put and nothing else moves. If
    it rejoins within the window the input is unchanged and so is the output: zero moves.
    When the window expires the assigner drops it from ``members``; its partitions become
    orphans and exactly those move (the leave case). Note that keeping the partitions in
    ``current`` while dropping the member from ``members`` is *not* enough: a holder that is
    not a member is treated as departed and its partitions are reassigned at once. Under
    ``hold_mode: handoff`` (the default) the departed sidecar is not a member meanwhile (the
    leave case at once), and its return is a join the coordinator steers back to its
    previous partitions.

Complexity: O(N log N + M log M) for N partitions and M members (sorts, heaps, per-zone
buckets; no N x M loop): 100,000 partitions x 2,000 members take under a second in COUNT
mode and about two in LOAD mode (tests/bench/bench_balancer.py).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from services.runtime.topic_partition import TopicPartition

__all__ = [
    "LOAD_TOLERANCE",
    "BalanceInput",
    "BalanceResult",
    "Member",
    "Move",
    "Strategy",
    "movement_lower_bound",
    "rebalance",
]

LOAD_TOLERANCE = 0.10
"""LOAD mode aims for the heaviest member's load <= (1 + LOAD_TOLERANCE) x mean load."""

# Float sums of the same weights in different groupings differ in the last bits; a load this
# close to the bound counts as within it, so rounding never causes a move.
_REL_EPS = 1e-9


class Strategy(StrEnum):
    COUNT = "count"
    LOAD = "load"


@dataclass(frozen=True)
class Member:
    """A live sidecar of the group."""

    id: str
    capacity: int | None = None
    """Maximum number of partitions it may hold; None means unlimited."""
    zone: str | None = None


class Move(NamedTuple):
    """A partition whose holder changes.

    ``source`` is the holder named in ``current`` (possibly a departed member) or None when
    the partition had no holder. ``target`` is the new holder; it is None only when a *live*
    member must give the partition up and no member has room for it (capacity short).
    """

    partition: TopicPartition
    source: str | None
    target: str | None


@dataclass(frozen=True)
class BalanceInput:
    partitions: Sequence[TopicPartition]
    """Every partition of the group's topics (duplicates are ignored)."""
    members: Sequence[Member]
    """The live sidecars; ids must be unique."""
    current: Mapping[TopicPartition, str]
    """Current holder per partition; may name departed members and omit partitions."""
    strategy: Strategy = Strategy.COUNT
    weights: Mapping[TopicPartition, float] = field(default_factory=dict)
    """LOAD mode: observed cost per partition (finite, >= 0)."""
    partition_zones: Mapping[TopicPartition, str] = field(default_factory=dict)
    """Zone/rack of each partition (e.g. of its leader); a soft preference only."""


@dataclass(frozen=True)
class BalanceResult:
    assignment: dict[TopicPartition, str]
    """Target holder per partition (in partition order)."""
    moves: list[Move]
    """Partitions whose holder changes, in partition order."""
    unassigned: list[TopicPartition]
    """Partitions nobody can take because the total capacity is short (sorted)."""


def rebalance(inp: BalanceInput) -> BalanceResult:
    """Compute the target assignment for one group; see the module docstring."""
    prep = _prepare(inp)
    plan = _plan_load(prep) if inp.strategy is Strategy.LOAD else _plan_count(prep)
    return _result(prep, plan)


def movement_lower_bound(inp: BalanceInput) -> int:
    """How many partitions held by live members must change holder to reach balance.

    COUNT mode: the exact minimum over every balanced outcome,
    ``min over balanced quotas of sum(max(0, held - quota))``; :func:`rebalance` always
    takes exactly this many partitions away from live members (orphans come on top).
    LOAD mode: the number of live-held partitions the load plan moves: for every member the
    fewest partitions whose removal brings it within capacity and tolerance, plus what is
    taken away to give an oversized partition a member of its own, minus any that land back
    on their holder. Minimal per member, but not a proven global optimum.
    """
    prep = _prepare(inp)
    plan = _plan_load(prep) if inp.strategy is Strategy.LOAD else _plan_count(prep)
    return len(plan.released)


# --- shared plumbing -------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    inp: BalanceInput
    partitions: list[TopicPartition]  # sorted, unique
    members: list[Member]  # sorted by id
    held: dict[str, list[TopicPartition]]  # live member id -> its current partitions, sorted
    orphans: list[TopicPartition]  # partitions without a live holder, sorted

    def zone_of(self, tp: TopicPartition) -> str | None:
        return self.inp.partition_zones.get(tp)


@dataclass
class _Plan:
    assignment: dict[TopicPartition, str]
    released: list[TopicPartition]  # taken away from a live holder
    unassigned: list[TopicPartition]


def _prepare(inp: BalanceInput) -> _Prepared:
    by_id: dict[str, Member] = {}
    for member in inp.members:
        if member.id in by_id:
            raise ValueError(f"duplicate member id {member.id!r}")
        if member.capacity is not None and member.capacity < 0:
            raise ValueError(f"member {member.id!r} has negative capacity {member.capacity}")
        by_id[member.id] = member
    members = sorted(by_id.values(), key=lambda m: m.id)
    partitions = sorted(set(inp.partitions))
    held: dict[str, list[TopicPartition]] = {m.id: [] for m in members}
    orphans: list[TopicPartition] = []
    for tp in partitions:
        holder = inp.current.get(tp)
        if holder is not None and holder in held:
            held[holder].append(tp)
        else:
            orphans.append(tp)
    return _Prepared(inp, partitions, members, held, orphans)


def _result(prep: _Prepared, plan: _Plan) -> BalanceResult:
    live = prep.held
    current = prep.inp.current
    assignment: dict[TopicPartition, str] = {}
    moves: list[Move] = []
    for tp in prep.partitions:
        old = current.get(tp)
        new = plan.assignment.get(tp)
        if new is not None:
            assignment[tp] = new
        if new != old and (new is not None or old in live):
            moves.append(Move(tp, old, new))
    return BalanceResult(assignment, moves, sorted(plan.unassigned))


def _in_zone(prep: _Prepared, tp: TopicPartition, member: Member) -> bool:
    return member.zone is not None and prep.zone_of(tp) == member.zone


# --- COUNT -----------------------------------------------------------------------------


def _filled(capacities: Iterable[int | None], level: int) -> int:
    return sum(level if c is None else min(c, level) for c in capacities)


def _water_level(capacities: list[int | None], n: int) -> int | None:
    """Highest level f with sum(min(capacity, f)) <= n; None if capacity is short of n."""
    if all(c is not None for c in capacities) and _filled(capacities, n) <= n:
        # Every member can be filled to capacity without running out of partitions.
        return None
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _filled(capacities, mid) <= n:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _split_surplus(
    prep: _Prepared, quotas: Mapping[str, int]
) -> tuple[dict[str, list[TopicPartition]], list[TopicPartition]]:
    """Each member keeps up to its quota of what it holds; out-of-zone partitions leave first."""
    kept: dict[str, list[TopicPartition]] = {}
    released: list[TopicPartition] = []
    for member in prep.members:
        holding = prep.held[member.id]
        surplus = len(holding) - quotas[member.id]
        if surplus <= 0:
            kept[member.id] = holding
            continue
        leave_first = sorted(holding, key=lambda tp: (_in_zone(prep, tp, member), tp))
        released.extend(leave_first[:surplus])
        kept[member.id] = sorted(leave_first[surplus:])
    return kept, released


def _pick_free_slots(
    prep: _Prepared,
    candidates: list[Member],
    slots: int,
    deficits: Mapping[str, int],
    pool: list[TopicPartition],
) -> list[Member]:
    """Choose which members below the +1 line take the movement-neutral +1 slots.

    Each slot goes to a member of the zone whose pooled partitions most exceed what that
    zone's members can already take (a concave gain, so this greedy maximises in-zone
    placements); once no zone is short, by held count then id.
    """
    shortfall: dict[str, int] = defaultdict(int)
    for tp in pool:
        zone = prep.zone_of(tp)
        if zone is not None:
            shortfall[zone] += 1
    by_zone: dict[str, list[Member]] = defaultdict(list)
    for member in prep.members:
        if member.zone is not None:
            shortfall[member.zone] -= deficits[member.id]
    rank = {m.id: (-len(prep.held[m.id]), m.id) for m in candidates}
    for member in sorted(candidates, key=lambda m: rank[m.id], reverse=True):
        if member.zone is not None:
            by_zone[member.zone].append(member)  # popped from the end: best rank last
    heap = [(-short, zone) for zone, short in shortfall.items() if short > 0 and by_zone[zone]]
    heapq.heapify(heap)
    chosen: list[Member] = []
    while heap and len(chosen) < slots:
        neg_short, zone = heapq.heappop(heap)
        chosen.append(by_zone[zone].pop())
        if neg_short + 1 < 0 and by_zone[zone]:
            heapq.heappush(heap, (neg_short + 1, zone))
    taken = {m.id for m in chosen}
    rest = sorted((m for m in candidates if m.id not in taken), key=lambda m: rank[m.id])
    return chosen + rest[: slots - len(chosen)]


def _count_quotas(prep: _Prepared) -> tuple[dict[str, int], list[Member], int]:
    """Quotas before the movement-neutral +1 slots, the candidates for those, their number."""
    n = len(prep.partitions)
    level = _water_level([m.capacity for m in prep.members], n)
    if level is None:
        return {m.id: m.capacity or 0 for m in prep.members}, [], 0
    quotas = {m.id: level if m.capacity is None else min(m.capacity, level) for m in prep.members}
    extra = n - sum(quotas.values())
    eligible = [m for m in prep.members if m.capacity is None or m.capacity > level]
    # A +1 for a member holding more than `level` saves exactly one move; prefer those.
    savers = sorted(
        (m for m in eligible if len(prep.held[m.id]) > level),
        key=lambda m: (-len(prep.held[m.id]), m.id),
    )
    for member in savers[:extra]:
        quotas[member.id] += 1
    if len(savers) >= extra:
        return quotas, [], 0
    saver_ids = {m.id for m in savers}
    return quotas, [m for m in eligible if m.id not in saver_ids], extra - len(savers)


def _plan_count(prep: _Prepared) -> _Plan:
    quotas, candidates, free_slots = _count_quotas(prep)
    kept, released = _split_surplus(prep, quotas)
    deficits = {m.id: quotas[m.id] - len(kept[m.id]) for m in prep.members}
    pool = sorted([*prep.orphans, *released])
    # Members below the +1 line hold at most `level`, so a +1 for them releases nothing:
    # the pool is final, and the slots only decide who receives from it.
    for member in _pick_free_slots(prep, candidates, free_slots, deficits, pool):
        deficits[member.id] += 1
    assignment = {tp: member_id for member_id, tps in kept.items() for tp in tps}
    unassigned = _fill_deficits(prep, deficits, pool, assignment)
    return _Plan(assignment, released, unassigned)


def _fill_deficits(
    prep: _Prepared,
    deficits: dict[str, int],
    pool: list[TopicPartition],
    assignment: dict[TopicPartition, str],
) -> list[TopicPartition]:
    """Hand the pool to members below quota, in-zone first; return what is left over."""
    by_zone: dict[str | None, list[TopicPartition]] = defaultdict(list)
    for tp in pool:
        by_zone[prep.zone_of(tp)].append(tp)
    taken_upto: dict[str | None, int] = defaultdict(int)
    neediest = sorted(prep.members, key=lambda m: (-deficits[m.id], m.id))
    for member in neediest:
        if member.zone is None or deficits[member.id] == 0:
            continue
        bucket = by_zone.get(member.zone, [])
        start = taken_upto[member.zone]
        chunk = bucket[start : start + deficits[member.id]]
        taken_upto[member.zone] = start + len(chunk)
        deficits[member.id] -= len(chunk)
        for tp in chunk:
            assignment[tp] = member.id
    rest = sorted(tp for zone, tps in by_zone.items() for tp in tps[taken_upto[zone] :])
    start = 0
    for member in sorted(prep.members, key=lambda m: (-deficits[m.id], m.id)):
        need = deficits[member.id]
        if need <= 0 or start >= len(rest):
            continue
        for tp in rest[start : start + need]:
            assignment[tp] = member.id
        start += need
    return rest[start:]


# --- LOAD ------------------------------------------------------------------------------


def _weights(prep: _Prepared) -> dict[TopicPartition, float]:
    given = {tp: prep.inp.weights[tp] for tp in prep.partitions if tp in prep.inp.weights}
    for tp, w in given.items():
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight of {tp} must be finite and >= 0, got {w!r}")
    default = math.fsum(given.values()) / len(given) if given else 1.0
    return {tp: float(given.get(tp, default)) for tp in prep.partitions}


def _within(load: float, bound: float) -> bool:
    return load <= bound + _REL_EPS * max(1.0, abs(bound))


@dataclass
class _Oversize:
    dedicated: dict[str, TopicPartition]  # member id -> the one partition it gets
    bound: float  # load bound for every other member


def _isolate_oversize(
    prep: _Prepared, weights: Mapping[TopicPartition, float], usable: list[Member]
) -> _Oversize:
    """Give each partition that alone breaks the tolerance a member of its own."""
    remaining_weight = math.fsum(weights.values())
    remaining_members = len(usable)
    usable_ids = {m.id for m in usable}
    current = prep.inp.current
    held_load = {m.id: math.fsum(weights[tp] for tp in prep.held[m.id]) for m in usable}
    spare = iter(sorted(usable, key=lambda m: (held_load[m.id], m.id)))
    dedicated: dict[str, TopicPartition] = {}
    for tp in sorted(prep.partitions, key=lambda tp: (-weights[tp], tp)):
        if remaining_members <= 1:
            break
        bound = (1 + LOAD_TOLERANCE) * remaining_weight / remaining_members
        if _within(weights[tp], bound):
            break
        holder = current.get(tp)
        if holder is None or holder not in usable_ids or holder in dedicated:
            holder = next(m.id for m in spare if m.id not in dedicated)
        dedicated[holder] = tp
        remaining_weight -= weights[tp]
        remaining_members -= 1
    if remaining_members <= 0:
        return _Oversize(dedicated, math.inf)
    bound = (1 + LOAD_TOLERANCE) * max(remaining_weight, 0.0) / remaining_members
    return _Oversize(dedicated, bound)


def _shed_overload(
    holding: list[TopicPartition], weights: Mapping[TopicPartition, float], bound: float
) -> tuple[list[TopicPartition], list[TopicPartition]]:
    """Fewest partitions whose removal brings the load within bound: (kept, shed)."""
    ordered = sorted(holding, key=lambda tp: (weights[tp], tp))
    ws = [weights[tp] for tp in ordered]
    load = math.fsum(ws)
    shed: list[TopicPartition] = []
    while ordered and not _within(load, bound):
        excess = load - bound
        i = bisect_left(ws, excess)
        if i < len(ws):  # the lightest single partition that is enough
            shed.append(ordered.pop(i))
            ws.pop(i)
            break
        shed.append(ordered.pop())
        load -= ws.pop()
    return ordered, shed


class _LoadHeaps:
    """Least-loaded member overall and per zone, with lazy invalidation."""

    def __init__(self, members: list[Member], load: dict[str, float], room: dict[str, float]):
        self.load = load
        self.room = room
        self.version = dict.fromkeys(load, 0)
        self.zone = {m.id: m.zone for m in members}
        self.all: list[tuple[float, str, int]] = []
        self.by_zone: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
        for member in members:
            self._push(member.id)

    def _push(self, member_id: str) -> None:
        if self.room[member_id] <= 0:
            return
        entry = (self.load[member_id], member_id, self.version[member_id])
        heapq.heappush(self.all, entry)
        zone = self.zone[member_id]
        if zone is not None:
            heapq.heappush(self.by_zone[zone], entry)

    def least(self, zone: str | None = None) -> str | None:
        heap = self.all if zone is None else self.by_zone.get(zone, [])
        while heap and heap[0][2] != self.version[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def add(self, member_id: str, weight: float) -> None:
        self.load[member_id] += weight
        self.room[member_id] -= 1
        self.version[member_id] += 1
        self._push(member_id)


def _plan_load(prep: _Prepared) -> _Plan:
    weights = _weights(prep)
    usable = [m for m in prep.members if m.capacity != 0]
    oversize = _isolate_oversize(prep, weights, usable)
    dedicated_tps = {tp: member_id for member_id, tp in oversize.dedicated.items()}
    assignment: dict[TopicPartition, str] = {}
    released: list[TopicPartition] = []
    load: dict[str, float] = {}
    room: dict[str, float] = {}
    for member in prep.members:
        holding = [tp for tp in prep.held[member.id] if tp not in dedicated_tps]
        kept: list[TopicPartition]
        shed: list[TopicPartition]
        if member.id in oversize.dedicated:
            kept, shed = [], holding
        else:
            kept, shed = _shed_overload(holding, weights, oversize.bound)
        capacity = math.inf if member.capacity is None else member.capacity
        if len(kept) > capacity:  # then also the lightest beyond capacity
            excess = len(kept) - int(capacity)
            shed += kept[:excess]
            kept = kept[excess:]
        released += shed
        released += [
            tp for tp in prep.held[member.id] if dedicated_tps.get(tp, member.id) != member.id
        ]
        for tp in kept:
            assignment[tp] = member.id
        load[member.id] = math.fsum(weights[tp] for tp in kept)
        room[member.id] = capacity - len(kept)
    for member_id, tp in oversize.dedicated.items():
        assignment[tp] = member_id
        load[member_id] += weights[tp]
        room[member_id] -= 1
    in_dedicated = set(dedicated_tps)
    pool = [tp for tp in [*prep.orphans, *released] if tp not in in_dedicated]
    pool.sort(key=lambda tp: (-weights[tp], tp))
    unassigned = _place_by_load(prep, weights, oversize, pool, load, room, assignment)
    # A shed partition can land back on its holder when the bound cannot be met anyway.
    current = prep.inp.current
    moved = sorted(tp for tp in released if assignment.get(tp) != current.get(tp))
    return _Plan(assignment, moved, unassigned)


def _place_by_load(
    prep: _Prepared,
    weights: Mapping[TopicPartition, float],
    oversize: _Oversize,
    pool: list[TopicPartition],
    load: dict[str, float],
    room: dict[str, float],
    assignment: dict[TopicPartition, str],
) -> list[TopicPartition]:
    """Heaviest first onto the least-loaded member of its zone if that stays within the
    bound, else onto the least-loaded member overall (a shed partition never fits back on
    the member that shed it, so there is no "previous holder" case)."""
    regular = [m for m in prep.members if m.id not in oversize.dedicated]
    spare = [m for m in prep.members if m.id in oversize.dedicated]
    heaps = _LoadHeaps(regular, load, room)
    spare_heaps = _LoadHeaps(spare, load, room)  # only when no regular member has room
    unassigned: list[TopicPartition] = []
    for tp in pool:
        w = weights[tp]
        target = None
        zone = prep.zone_of(tp)
        if zone is not None:
            local = heaps.least(zone)
            if local is not None and _within(load[local] + w, oversize.bound):
                target = local
        if target is None:
            target = heaps.least()
        if target is None:
            target = spare_heaps.least()
            if target is None:
                unassigned.append(tp)
                continue
            spare_heaps.add(target, w)
        else:
            heaps.add(target, w)
        assignment[tp] = target
    return unassigned
