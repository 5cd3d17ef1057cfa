"""Benchmark: ``ReadRange``'s readers with their consumer pool beside a new consumer per
read (what every read paid before the pool), in the same run.

    .venv/bin/python tests/bench/bench_range_reads.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap), produces records of 100 B to a
12-partition topic, then reads it the way a Spark micro-batch does: for each batch, one
range per partition (records/batches of each), one after the other on one thread, in
``ARROW_IPC`` chunks of 4 MiB, through ``services.consumer_sidecar.reader.RangeReaders``:
(a) ``max_idle=0``: a new confluent-kafka consumer per read; (b) the pool (the sidecar's
default). Rounds alternate (a) and (b). Prints per mode the median and best of the rounds
(reads/s, ms per read, records/s) and the ratio (b)/(a), and how many consumers each made.
Never asserts a time. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.consumer_sidecar.kafka_config import READER_FETCH_WAIT_MS
from services.consumer_sidecar.reader import RangeReaders, RangeSpec
from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic
from services.runtime.topic_partition import TP
from tests.support.sidecar_probe import produce_bulk

PARTITIONS = 12
VALUE_SIZE = 100
CHUNK_BYTES = 4 << 20
SHORT = (120_000, 4, 3)  # records, batches, rounds
FULL = (600_000, 10, 5)


def read_batches(
    readers: RangeReaders, topic: str, records: int, batches: int
) -> tuple[float, int, int]:
    """(seconds, reads, records read)."""
    per_partition = records // PARTITIONS
    step = per_partition // batches
    reads = got = 0
    started = time.perf_counter()
    for batch in range(batches):
        for partition in range(PARTITIONS):
            start = batch * step
            spec = RangeSpec(
                TP(topic, partition), start, start + step, CHUNK_BYTES, epoch=1, arrow=True
            )
            read = readers.open(spec)
            try:
                while (chunk := read.next_chunk()) is not None:
                    got += chunk.count
                    if chunk.next_offset >= spec.to_offset:
                        break
            finally:
                read.close()
            reads += 1
    return time.perf_counter() - started, reads, got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use a running Kafka instead of starting one")
    parser.add_argument(
        "--fetch-wait-ms",
        type=int,
        default=READER_FETCH_WAIT_MS,
        help="the readers' fetch.wait.max.ms (the sidecar's: %(default)s)",
    )
    args = parser.parse_args()
    records, batches, rounds = SHORT if args.short else FULL
    with tempfile.TemporaryDirectory(prefix="bench-range-") as tmp:
        cluster: KafkaCluster | None = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            cluster = KafkaCluster(KafkaOptions(base_dir=Path(tmp) / "kafka")).start()
            bootstrap = cluster.bootstrap
        try:
            topic = f"bench-range-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, PARTITIONS)
            produce_bulk(bootstrap, topic, records, VALUE_SIZE, PARTITIONS)
            config = {
                "bootstrap.servers": bootstrap,
                "group.id": f"{topic}.ds-reader",
                **(
                    {"fetch.wait.max.ms": args.fetch_wait_ms}
                    if args.fetch_wait_ms is not None
                    else {}
                ),
            }
            modes = {"new consumer per read": 0, "consumer pool": 4}
            seconds: dict[str, list[float]] = {m: [] for m in modes}
            made: dict[str, int] = {}
            reads = 0
            for _ in range(rounds):
                for mode, max_idle in modes.items():
                    readers = RangeReaders(lambda: dict(config), max_idle=max_idle)
                    try:
                        took, reads, got = read_batches(readers, topic, records, batches)
                    finally:
                        readers.close()
                    if got != (records // PARTITIONS // batches) * batches * PARTITIONS:
                        raise SystemExit(f"{mode}: read {got} records, expected more")
                    seconds[mode].append(took)
                    made[mode] = readers.consumers_made
            print(
                f"\n{reads} reads of {records // PARTITIONS // batches} records per round, "
                f"{rounds} rounds"
            )
            for mode, runs in seconds.items():
                med, best = statistics.median(runs), min(runs)
                print(
                    f"  {mode:24} {reads / med:7.1f} reads/s median ({reads / best:.1f} best), "
                    f"{1000 * med / reads:6.1f} ms per read, {got / med:9,.0f} records/s median; "
                    f"{made[mode]} consumers made"
                )
            base, pooled = (statistics.median(seconds[m]) for m in modes)
            bbest, pbest = (min(seconds[m]) for m in modes)
            print(
                f"  pool / new consumer: {base / pooled:.2f}x median, "
                f"{bbest / pbest:.2f}x best (records/s)"
            )
        finally:
            if cluster is not None:
                cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
