"""The sidecar's delivery path under each ordering (issue 39): the partition table's take
and ack, in process, unordered (the baseline, measured in the same run) beside key and
partition.

    python tests/bench/bench_ordering_take.py [--records 40000 --keys 1000 --repeat 3]
        [--batch 100 --lag 1]

4 partitions of keyed records (random keys) in column chunks; 4 holders take in turn (up
to --batch records each) and ack what they took after the next holder's take (``--lag``
takes later: a Stream's credit keeps thousands in flight; so records are in flight to
several holders at once, as with clients processing in parallel), until
every record was acked. Printed per ordering: records/s (best and median of --repeat),
takes that returned nothing (held back), and the ratio to unordered. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from dsclient.records.batches import Slice, chunk_of
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.ordering import Ordering
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.runtime.topic_partition import TP

PARTITIONS = 4
HOLDERS = 4
CHUNK = 500


def loaded(records: int, keys: int, ordering: Ordering, seed: int) -> PartitionTable:
    rnd = random.Random(seed)
    table = PartitionTable(1 << 40, lambda: 0.0)
    table.ordering = ordering
    per = records // PARTITIONS
    for p in range(PARTITIONS):
        tp = TP("t", p)
        table.add(Partition(tp=tp, epoch=1, deadline=1e10, acks=PartitionAcks(0), ready=True))
        for lo in range(0, per, CHUNK):
            n = min(CHUNK, per - lo)
            chunk = chunk_of(
                array("q", range(lo, lo + n)),
                None,
                [b"v" * 100] * n,
                [b"k%d" % rnd.randrange(keys) for _ in range(n)],
                [None] * n,
            )
            table.append(tp, chunk)
    return table


def drain(table: PartitionTable, batch: int, lag: int = 1) -> tuple[int, int]:
    """Take and ack until empty; (records acked, empty takes)."""
    pending: list[list[Slice]] = []
    acked = empty = 0
    turn = 0
    while True:
        holder = (f"c{turn % HOLDERS}", 1)
        turn += 1
        taken = table.take(batch, 1 << 30, holder)
        if not taken:
            empty += 1
        pending.append(taken)
        if len(pending) > lag or not taken:
            for s in pending.pop(0):
                part = table.partitions[TP(s.topic, s.partition)]
                table.ack_range(part, s.first_offset, s.last_offset + 1)
                acked += len(s)
        if (
            not taken
            and not any(pending)
            and all(not (p.buffer or p.staged) for p in table.snapshot())
        ):
            return acked, empty


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lag", type=int, default=1, help="takes between a take and its ack")
    args = parser.parse_args()
    results: dict[Ordering, list[float]] = {}
    for ordering in (Ordering.UNORDERED, Ordering.KEY, Ordering.PARTITION):
        rates = []
        for r in range(args.repeat):
            table = loaded(args.records, args.keys, ordering, seed=r)
            started = time.perf_counter()
            acked, empty = drain(table, args.batch, args.lag)
            elapsed = time.perf_counter() - started
            assert acked == args.records // PARTITIONS * PARTITIONS, acked
            rates.append(acked / elapsed)
        results[ordering] = rates
        base = results[Ordering.UNORDERED]
        print(
            f"{ordering.value:10s} best {max(rates):10,.0f} rec/s, median "
            f"{statistics.median(rates):10,.0f} rec/s, empty takes {empty}; "
            f"ratio to unordered best {max(rates) / max(base):.2f}, "
            f"median {statistics.median(rates) / statistics.median(base):.2f}"
        )


if __name__ == "__main__":
    main()
