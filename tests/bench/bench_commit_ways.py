"""What a sidecar's commit costs in CPU, the commit thread's way and the event loop's (issue
34, the twenty-first pass of docs/benchmarks/pod-cost.md).

    .venv/bin/python tests/bench/bench_commit_ways.py [--short] [--bootstrap HOST:PORT]
        [--rate 100 --window 8 --rounds 3]

With commit on ack (the default), every ack the application makes at the rates services
run is a commit of its own. The sidecar's committer (``OffsetCommitter``, real, on a real
broker) commits one leased partition ``--rate`` times a second, in one process, three
ways, rounds interleaved:

* ``baseline``: the event loop ticks at the rate and commits nothing;
* ``thread``: each tick a commit on the commit thread, synchronous, awaited by the loop
  (the committer without ``completions``: how every leased commit went before);
* ``loop``: each tick a commit handed to librdkafka from the loop, its answer taken by the
  loop's own polls (``commit_completions``: how a commit with nothing to read back goes).

Each commit is awaited before the next tick, so a way whose answer takes longer than a
tick makes fewer than ``--rate`` commits a second (at 1,000 a second, say). Printed per
way: the process's CPU in millicores (median and best of the rounds; the threads'
nanoseconds, as bench_pod_cost reads them), its wake-ups a second, the commits a second it
made, what a commit adds over the baseline in microseconds of CPU, and each commit's time
until its answer (median). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.commit_completions import CommitCompletions
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.devstack.kafka import create_topic, delete_topic
from services.runtime.kafka import new_consumer
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from tests.support.bench_kafka import bench_kafka
from tests.support.proc_usage import read_usage, usage_rate

WAYS = ("baseline", "thread", "loop")
EPOCH = 1


class Committer:
    """A leased sidecar's committer and its commit consumer, holding ``tp``; ``loop``:
    with the answers of the loop's commits taken (the sidecar's wiring), else without."""

    def __init__(self, bootstrap: str, group: str, tp: TP, *, loop: bool) -> None:
        settings = ServiceSettings(bootstrap=bootstrap)
        table = PartitionTable(1 << 20, time.monotonic)
        completions = CommitCompletions() if loop else None
        overrides = {"on_commit": completions.on_commit} if completions else {}
        self.fetch = new_consumer(settings, group=group, client_id="bench-fetch")
        self.consumer = new_consumer(
            settings, group=group, client_id="bench-commit", overrides=overrides
        )
        self.commits = OffsetCommitter(
            table, sidecar_id="bench", consumer=self.consumer, completions=completions
        )
        self.commits.external_changes = "ignore"  # the read-backs are bench_external_check's
        Fetcher(self.fetch, table, self.commits, batch=100, on_data=lambda: None)
        table.add(
            Partition(tp=tp, epoch=EPOCH, deadline=time.monotonic() + 3600, acks=PartitionAcks(0))
        )
        self.tp = tp

    def close(self) -> None:
        self.commits.stop()
        self.fetch.close()


async def _round(
    way: str, committer: Committer, rate: float, window: float, offset: int
) -> tuple[float, float, list[float], int, float]:
    """One window: (millicores, wake-ups/s, each commit's seconds, the next offset, commits
    a second made: fewer than ``rate`` once a commit's answer takes longer than a tick)."""
    loop = asyncio.get_running_loop()
    period = 1.0 / rate
    took: list[float] = []
    started, before = time.monotonic(), read_usage(os.getpid())
    due = loop.time()
    while loop.time() - started < window:  # loop.time() is time.monotonic()
        due += period
        await asyncio.sleep(max(0.0, due - loop.time()))
        if way == "baseline":
            continue
        offset += 1
        asked = time.monotonic()
        sent = await committer.commits.commit_async([CommitRequest(committer.tp, offset, EPOCH)])
        took.append(time.monotonic() - asked)
        assert sent, "the lease lasts the whole run"
    seconds = time.monotonic() - started
    used = usage_rate(before, read_usage(os.getpid()), seconds)
    return 1000 * used.cores, used.wakeups, took, offset, len(took) / seconds


async def run(bootstrap: str, topic: str, args: argparse.Namespace) -> None:
    tp = TP(topic, 0)
    committers = {
        "thread": Committer(bootstrap, f"bench-ways-t-{topic}", tp, loop=False),
        "loop": Committer(bootstrap, f"bench-ways-l-{topic}", tp, loop=True),
    }
    committers["baseline"] = committers["thread"]
    cores: dict[str, list[float]] = {way: [] for way in WAYS}
    wakes: dict[str, list[float]] = {way: [] for way in WAYS}
    took: dict[str, list[float]] = {way: [] for way in WAYS}
    made: dict[str, list[float]] = {way: [] for way in WAYS}
    offset = 0
    try:
        await committers["loop"].commits.commit_async([CommitRequest(tp, 0, EPOCH)])  # warm
        await committers["thread"].commits.commit_async([CommitRequest(tp, 0, EPOCH)])
        for _ in range(args.rounds):
            for way in WAYS:  # interleaved: a busy moment of the machine hits every way
                mcores, wakeups, times, offset, rate = await _round(
                    way, committers[way], args.rate, args.window, offset
                )
                made[way].append(rate)
                cores[way].append(mcores)
                wakes[way].append(wakeups)
                took[way] += times
    finally:
        for way in ("thread", "loop"):
            committers[way].close()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.rate:.0f} commits a second, "
          f"{args.rounds} rounds of {args.window:.0f} s; millicores median / best")  # fmt: skip
    base = statistics.median(cores["baseline"])
    for way in WAYS:
        median, best = statistics.median(cores[way]), min(cores[way])
        woke = statistics.median(wakes[way])
        line = f"  {way:9s} {median:6.1f} / {best:6.1f}, {woke:6.0f} wake-ups/s"
        if way != "baseline":
            rate = statistics.median(made[way])
            extra = (median - base) / rate * 1000  # millicores per (1/s) -> us a commit
            answered = 1000 * statistics.median(took[way])
            line += (
                f"; {rate:.0f} commits/s, {extra:.0f} us of CPU a commit over the baseline, "
                f"answered in {answered:.1f} ms"
            )
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument("--rate", type=float, default=100.0, help="commits a second")
    parser.add_argument("--window", type=float, default=8.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", action="store_true", help="3 rounds of 4 s")
    args = parser.parse_args()
    if args.short:
        args.window, args.rounds = 4.0, 3
    started = time.monotonic()
    with bench_kafka(args.bootstrap, announce=True) as kafka:
        topic = f"bench-ways-{uuid.uuid4().hex[:8]}"
        create_topic(kafka.bootstrap, topic, 1)
        try:
            asyncio.run(run(kafka.bootstrap, topic, args))
        finally:
            delete_topic(kafka.bootstrap, topic)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
