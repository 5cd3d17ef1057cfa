"""Benchmark of the partition balancer against a naive round-robin baseline, same run.

    python tests/bench/bench_balancer.py [--partitions 100000 --members 2000 --repeat 3]
    python tests/bench/bench_balancer.py --short        # CI profile: 10,000 x 200

Scenarios: (a) full assignment from nothing, (b) one member joins, (c) one member leaves,
(d) LOAD-mode full assignment. The baseline is what Kafka's RoundRobinAssignor does: sort
partitions and members, deal partitions out in turn, no stickiness; on a join or leave it
re-deals from its own previous round-robin state. Printed: best-of-repeat wall time,
partitions moved, balance, and the ratios ours/baseline. Nothing is asserted about time.
The same figures are written to docs/benchmarks/results/balancer.json (the site renders it;
--no-results skips it).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from services.assigner.balancer import (
    BalanceInput,
    BalanceResult,
    Member,
    Strategy,
    rebalance,
)
from services.runtime.topic_partition import TopicPartition
from tests.support.bench_results import write_result

ZONES = ("zone-a", "zone-b", "zone-c")
TOPICS = 50


@dataclass(frozen=True)
class Outcome:
    seconds: float
    assignment: dict[TopicPartition, str]
    moved: int


def round_robin(inp: BalanceInput) -> dict[TopicPartition, str]:
    """Kafka RoundRobinAssignor: sorted partitions dealt over sorted members in turn."""
    members = sorted(m.id for m in inp.members)
    return {tp: members[i % len(members)] for i, tp in enumerate(sorted(inp.partitions))}


def moved_count(before: dict[TopicPartition, str], after: dict[TopicPartition, str]) -> int:
    return sum(1 for tp, holder in after.items() if before.get(tp) != holder)


def best_of(
    repeat: int, run: Callable[[], dict[TopicPartition, str]], before: dict[TopicPartition, str]
) -> Outcome:
    best = float("inf")
    assignment: dict[TopicPartition, str] = {}
    for _ in range(repeat):
        start = time.perf_counter()
        assignment = run()
        best = min(best, time.perf_counter() - start)
    return Outcome(best, assignment, moved_count(before, assignment))


def ours(inp: BalanceInput) -> Callable[[], dict[TopicPartition, str]]:
    def run() -> dict[TopicPartition, str]:
        result: BalanceResult = rebalance(inp)
        return result.assignment

    return run


def count_spread(assignment: dict[TopicPartition, str], members: Sequence[Member]) -> str:
    counts = Counter(assignment.values())
    values = [counts[m.id] for m in members]
    return f"count {min(values)}..{max(values)}"


def load_spread(
    assignment: dict[TopicPartition, str],
    members: Sequence[Member],
    weights: dict[TopicPartition, float],
) -> str:
    loads = dict.fromkeys((m.id for m in members), 0.0)
    for tp, holder in assignment.items():
        loads[holder] += weights[tp]
    mean = sum(loads.values()) / len(loads)
    return f"max/mean load {max(loads.values()) / mean:.3f}"


def in_zone_share(assignment: dict[TopicPartition, str], inp: BalanceInput) -> str:
    zone_of = {m.id: m.zone for m in inp.members}
    home = sum(1 for tp, h in assignment.items() if inp.partition_zones.get(tp) == zone_of[h])
    return f"in-zone {home / max(1, len(assignment)):.0%}"


def report(
    name: str, mine: Outcome, base: Outcome, quality: Callable[[Outcome], str]
) -> dict[str, object]:
    """Print one scenario and return it as a row of the results file."""
    time_ratio = mine.seconds / base.seconds if base.seconds else float("inf")
    move_ratio = f"{mine.moved / base.moved:.4f}" if base.moved else "n/a"
    print(f"{name}")
    print(f"  balancer   {mine.seconds:8.3f} s  moved {mine.moved:>7}  {quality(mine)}")
    print(f"  baseline   {base.seconds:8.3f} s  moved {base.moved:>7}  {quality(base)}")
    print(f"  ratio      time x{time_ratio:.1f}   moved {move_ratio}")
    return {
        "scenario": name,
        "balancer s": round(mine.seconds, 4),
        "baseline s": round(base.seconds, 4),
        "time ratio": round(time_ratio, 2),
        "balancer moved": mine.moved,
        "baseline moved": base.moved,
        "moved ratio": move_ratio,
        "balancer balance": quality(mine),
        "baseline balance": quality(base),
    }


def build(n_partitions: int, n_members: int) -> tuple[BalanceInput, dict[TopicPartition, float]]:
    rnd = random.Random(20240601)  # fixed seed: the same input on every run
    per_topic = -(-n_partitions // TOPICS)
    partitions = [
        TopicPartition(f"topic-{t:02d}", p) for t in range(TOPICS) for p in range(per_topic)
    ][:n_partitions]
    rnd.shuffle(partitions)  # the balancer must not depend on input order
    members = [Member(f"sidecar-{i:05d}", None, ZONES[i % len(ZONES)]) for i in range(n_members)]
    zones = {tp: ZONES[(sum(map(ord, tp.topic)) + tp.partition) % len(ZONES)] for tp in partitions}
    # bytes/s-like skew: most partitions light, a few ten times heavier
    weights = {tp: rnd.paretovariate(3.0) for tp in partitions}
    return BalanceInput(partitions, members, {}, partition_zones=zones), weights


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--members", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--short", action="store_true", help="CI profile: 10,000 x 200")
    parser.add_argument(
        "--no-results", action="store_true", help="do not write docs/benchmarks/results/"
    )
    args = parser.parse_args(argv)
    if args.short:
        args.partitions, args.members = 10_000, 200
    base_inp, weights = build(args.partitions, args.members)
    members = list(base_inp.members)
    print(
        f"balancer benchmark: {args.partitions} partitions x {args.members} members, "
        f"best of {args.repeat}, Python {sys.version.split()[0]}"
    )

    def by_count(o: Outcome) -> str:
        return count_spread(o.assignment, members)

    # (a) full assignment from nothing
    full = best_of(args.repeat, ours(base_inp), {})
    rr_full = best_of(args.repeat, lambda: round_robin(base_inp), {})
    rows: list[dict[str, object]] = []
    rows.append(
        report(
            "(a) full assignment",
            full,
            rr_full,
            lambda o: (
                f"{count_spread(o.assignment, members)}, {in_zone_share(o.assignment, base_inp)}"
            ),
        )
    )

    # (b) one member joins: each side starts from its own previous assignment
    joined = [*members, Member("sidecar-new", None, ZONES[0])]
    join_inp = replace(base_inp, members=joined, current=full.assignment)
    rr_join_inp = replace(base_inp, members=joined, current=rr_full.assignment)
    rows.append(
        report(
            "(b) one join",
            best_of(args.repeat, ours(join_inp), full.assignment),
            best_of(args.repeat, lambda: round_robin(rr_join_inp), rr_full.assignment),
            lambda o: count_spread(o.assignment, joined),
        )
    )

    # (c) one member leaves
    left = members[1:]
    leave_inp = replace(base_inp, members=left, current=full.assignment)
    rr_leave_inp = replace(base_inp, members=left, current=rr_full.assignment)
    rows.append(
        report(
            "(c) one leave",
            best_of(args.repeat, ours(leave_inp), full.assignment),
            best_of(args.repeat, lambda: round_robin(rr_leave_inp), rr_full.assignment),
            lambda o: count_spread(o.assignment, left),
        )
    )

    # (d) LOAD mode, full assignment from nothing
    load_inp = replace(base_inp, strategy=Strategy.LOAD, weights=weights)
    rows.append(
        report(
            "(d) LOAD full assignment",
            best_of(args.repeat, ours(load_inp), {}),
            best_of(args.repeat, lambda: round_robin(load_inp), {}),
            lambda o: load_spread(o.assignment, members, weights),
        )
    )
    if not args.no_results:
        path = write_result(
            "balancer",
            title="Balancer against round-robin",
            summary="The pure balancer (services/assigner/balancer.py) against Kafka's "
            "RoundRobinAssignor re-dealing from its own previous state, same input, same run: "
            "wall time (best of the repeats), partitions moved, and the spread of the result.",
            load={"partitions": args.partitions, "members": args.members, "repeat": args.repeat},
            results=rows,
            argv=["tests/bench/bench_balancer.py", *(sys.argv[1:] if argv is None else argv)],
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
