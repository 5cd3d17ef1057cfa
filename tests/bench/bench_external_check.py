"""Benchmark: what noticing external offset changes costs the sidecar's ack path (issue 23).

    .venv/bin/python tests/bench/bench_external_check.py [--short] [--bootstrap HOST:PORT]

A leased group's sidecar reads the committed offsets back (one OffsetFetch) right before
each commit, and every 0.5 s for all held partitions, to notice a commit it did not make
(``kafka-consumer-groups --reset-offsets``). With ``ack`` waiting for its commit, the
OffsetFetch before the commit is on the application's path. This measures it against the
same path without it, in the same run: each group's ``external_offset_changes`` is either
``follow`` (the default: the checks on) or ``ignore`` (the operator setting that turns
them off; the commits overwrite external changes unseen).

Produces N records of 100 B over 8 partitions once, then reads them all through a fresh
sidecar and group per measurement, alternating the two settings:

(b)  ``DsClient.fetch`` batches of up to 10,000 + ``ack(batch)`` (its answer waits for
     the commit, so for the OffsetFetch before it);
(b2) the same with ``ack_nowait(batch)`` (every answer checked before the rate is taken).

Rates run from the first batch to the last (steady state). A shared machine makes single
runs noisy, so each setting runs ROUNDS times, interleaved, the order flipped every
round; the best of each and the median of the per-round ratios are printed. Never
asserts a time.
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

from services.devstack.kafka import create_topic, delete_topic
from tests.bench.bench_sidecar import PARTITIONS, Rate, best, fetch_through
from tests.support.bench_kafka import bench_kafka
from tests.support.mesh import running_mesh
from tests.support.sidecar_probe import produce_bulk

SETTINGS = ("follow", "ignore")
SHORT = (300_000, 3)  # records, rounds per setting and ack kind
FULL = (1_000_000, 5)


def group_name(setting: str, kind: str, i: int, topic: str) -> str:
    return f"g-{setting}-{kind}{i}-{topic}"


def run(bootstrap: str, records: int, rounds: int, log_dir: Path) -> None:
    topic = f"bench-extcheck-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, PARTITIONS)
    kinds = {"b": False, "b2": True}  # ack kind -> nowait
    config = log_dir / "assigner.yaml"
    config.write_text(
        "groups:\n"
        + "".join(
            f"  - name: {group_name(s, k, i, topic)}\n    topics: [{topic}]\n"
            f"    external_offset_changes: {s}\n"
            for s in SETTINGS
            for k in kinds
            for i in range(rounds)
        )
    )
    print(
        f"{records} records x 100 B over {PARTITIONS} partitions; (b) DsClient.fetch + "
        "ack(batch), committed before it returns; (b2) the same with ack_nowait(batch). "
        "follow = the checks on (default), ignore = off. Best of "
        f"{rounds} interleaved rounds each, and the median of the rounds' ratios."
    )
    try:
        took = produce_bulk(bootstrap, topic, records, 100, PARTITIONS)
        print(f"produced in {took:.1f}s", flush=True)
        with running_mesh(bootstrap, log_dir) as mesh:
            assigner = mesh.service("assigner", "--config", str(config))
            assigner.wait_serving()
            rates: dict[tuple[str, str], list[Rate]] = {(s, k): [] for s in SETTINGS for k in kinds}
            for i in range(rounds):
                order = SETTINGS if i % 2 == 0 else tuple(reversed(SETTINGS))
                for kind, nowait in kinds.items():
                    for setting in order:
                        rates[(setting, kind)].append(
                            fetch_through(
                                mesh,
                                assigner,
                                group_name(setting, kind, i, topic),
                                records,
                                nowait=nowait,
                            )
                        )
                print(
                    f"   round {i + 1}: "
                    + "  ".join(
                        f"({k}, {s}) {v[-1].per_second:,.0f}" for (s, k), v in rates.items()
                    )
                    + " rec/s",
                    flush=True,
                )
            for kind in kinds:
                on, off = rates[("follow", kind)], rates[("ignore", kind)]
                ratios = [a.per_second / b.per_second for a, b in zip(on, off, strict=True)]
                print(f"({kind}) checks on  (follow) best {best(on)}")
                print(f"({kind}) checks off (ignore) best {best(off)}")
                print(
                    f"({kind}) on/off: best {best(on).per_second / best(off).per_second:.3f}, "
                    f"median of rounds {statistics.median(ratios):.3f} "
                    f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})",
                    flush=True,
                )
    finally:
        try:
            delete_topic(bootstrap, topic)
        except Exception as exc:  # a bench must still print what it measured
            print(f"could not delete {topic}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    args = parser.parse_args()
    records, rounds = SHORT if args.short else FULL
    started = time.monotonic()
    with (
        bench_kafka(args.bootstrap, announce=True) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-extcheck-") as tmp,
    ):
        run(kafka.bootstrap, records, rounds, Path(tmp))
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
