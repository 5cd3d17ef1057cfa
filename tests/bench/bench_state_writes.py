"""Benchmark: the assigner's state writes as transactions (fenced, issue 17 path 4) beside
the idempotent producer they replaced, in the same run.

    .venv/bin/python tests/bench/bench_state_writes.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap) and one state topic per mode.
Two workloads, ROUNDS times interleaved per mode:

(a) one grant at a time: N ``put_epochs`` of one partition, each awaited before the next
    (a grant waits for its epoch: this is what a single grant's latency pays);
(b) a burst: N ``put_epochs`` issued at once, all awaited (a scale-out or a takeover
    deciding many grants: the transactional writer folds the queued writes into one
    transaction per round).

Prints per mode the median and best of the rounds (writes/s and ms per write) and the
ratio transactional/idempotent. Never asserts a time. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.assigner.state import StateStore
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from tests.support.bench_kafka import bench_kafka

SHORT = (200, 3)  # writes per round, rounds
FULL = (1000, 5)
MODES = ("idempotent", "transactional")


async def one_at_a_time(store: StateStore, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        await store.put_epochs("bench", [(TP("t", i % 64), i + 1)])
    return time.perf_counter() - started


async def burst(store: StateStore, n: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(store.put_epochs("bench", [(TP("t", i % 64), i + 1)]) for i in range(n)))
    return time.perf_counter() - started


def report(name: str, n: int, seconds: dict[str, list[float]]) -> None:
    print(f"\n({name}) {n} writes per round, {len(seconds[MODES[0]])} rounds")
    medians = {}
    for mode in MODES:
        med, low = statistics.median(seconds[mode]), min(seconds[mode])
        medians[mode] = med
        print(
            f"  {mode:13s} median {n / med:8.0f} writes/s ({med / n * 1000:6.2f} ms each), "
            f"best {n / low:8.0f} writes/s ({low / n * 1000:6.2f} ms each)"
        )
    ratio = medians[MODES[0]] / medians[MODES[1]]
    best_ratio = min(seconds[MODES[0]]) / min(seconds[MODES[1]])
    print(f"  throughput transactional/idempotent: median {ratio:.2f}, best {best_ratio:.2f}")


def run(bootstrap: str, n: int, rounds: int) -> None:
    settings = ServiceSettings(bootstrap=bootstrap)
    run_id = uuid.uuid4().hex[:6]
    stores = {
        "idempotent": StateStore(settings, topic=f"bench-state-i-{run_id}"),
        "transactional": StateStore(
            settings,
            topic=f"bench-state-t-{run_id}",
            transactional_id=f"bench-state-{run_id}",
        ),
    }
    try:
        for store in stores.values():
            store.ensure_topic()
            store.begin_term()
        results: dict[str, dict[str, list[float]]] = {
            "a": {m: [] for m in MODES},
            "b": {m: [] for m in MODES},
        }

        async def rounds_of() -> None:
            for mode in MODES:  # warm up: connections, the transaction coordinator
                await one_at_a_time(stores[mode], 20)
            for _ in range(rounds):
                for mode in MODES:
                    results["a"][mode].append(await one_at_a_time(stores[mode], n))
                    results["b"][mode].append(await burst(stores[mode], n))

        asyncio.run(rounds_of())
        report("a: one grant at a time", n, results["a"])
        report("b: a burst of grants", n, results["b"])
    finally:
        for store in stores.values():
            store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    args = parser.parse_args()
    n, rounds = SHORT if args.short else FULL
    started = time.monotonic()
    with bench_kafka(args.bootstrap) as kafka:
        run(kafka.bootstrap, n, rounds)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
