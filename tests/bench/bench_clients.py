"""Benchmark: each client's throughput through one sidecar beside a direct consumer in the
same language (issue 20).

    .venv/bin/python tests/bench/bench_clients.py [--clients python,go,java] [--records N]
                                                  [--rounds R] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap) and produces N records of 100 B
and N/2 of 1 KiB into two 6-partition topics. Then, for each client (its ``dsread``:
tests/support/readers.py) and size, ROUNDS times interleaved, it times

- **mesh**: ``dsread --quiet`` reading every record through ONE sidecar (a fresh group
  each time, so the sidecar starts from the beginning), acking each batch explicitly;
- **direct**: ``dsread --direct --quiet``, the language's own Kafka consumer (confluent-kafka,
  confluent-kafka-go, Java's KafkaConsumer) reading the same topic in a fresh group,
  committing after each batch.

Each rate is the reader's own: distinct records / seconds from its first record to its last
(process and JVM start-up are not timed on either side). Printed per client and size: the
median of the rounds beside the best, for both, and their ratio (mesh / direct). No time is
asserted (CONVENTIONS "Tests"). Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.devstack.kafka import create_topic
from tests.support.bench_kafka import bench_kafka
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.readers import READERS, Reader
from tests.support.sidecar_probe import produce_bulk, start_sidecar

PARTITIONS = 6
SIZES = {"100B": 100, "1KiB": 1024}


def parse_done(stdout: str) -> dict[str, float]:
    for line in stdout.splitlines():
        if line.startswith("done "):
            return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    raise RuntimeError(f"no done line in {stdout[-500:]!r}")


def timed(reader: Reader, args: list[str], expect: int) -> float:
    """Records/s of one dsread run (its own first-to-last timing)."""
    result = subprocess.run(
        reader.command(*args, "--expect", str(expect), "--quiet", "--idle-exit-s", "60"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{reader.name} dsread {args} exited {result.returncode}: {result.stderr[-2000:]}"
        )
    done = parse_done(result.stdout)
    if done["distinct"] != expect:
        raise RuntimeError(f"{reader.name} read {done} of {expect}")
    return done["distinct"] / max(done["seconds"], 1e-6)


def through_mesh(
    mesh: Mesh, assigner: ServiceProcess, reader: Reader, group: str, expect: int
) -> float:
    sidecar = start_sidecar(mesh, group, assigner, f"bench-{group[-20:]}")
    try:
        sidecar.wait_serving()
        return timed(
            reader,
            ["--assigner", assigner.grpc_addr, "--group", group,
             "--client-id", f"bench-{reader.name}"],
            expect,
        )  # fmt: skip
    finally:
        sidecar.stop()


def summary(name: str, size: str, mesh_rates: list[float], direct_rates: list[float]) -> str:
    m_med, m_best = statistics.median(mesh_rates), max(mesh_rates)
    d_med, d_best = statistics.median(direct_rates), max(direct_rates)
    return (
        f"{name:7} {size:5} mesh {m_med:>9,.0f}/s (best {m_best:>9,.0f})  "
        f"direct {d_med:>9,.0f}/s (best {d_best:>9,.0f})  "
        f"ratio {m_med / d_med:.2f} (best/best {m_best / d_best:.2f})"
    )


def run(bootstrap: str, clients: list[Reader], records: int, rounds: int, log_dir: Path) -> None:
    counts = {"100B": records, "1KiB": records // 2}
    topics = {size: f"bench-clients-{size.lower()}-{int(time.time())}" for size in SIZES}
    for size, topic in topics.items():
        create_topic(bootstrap, topic, PARTITIONS)
        took = produce_bulk(bootstrap, topic, counts[size], SIZES[size], PARTITIONS)
        print(f"produced {counts[size]:,} records of {size} to {topic} in {took:.1f}s")
    groups = [
        (f"g-{c.name}-{size}-{r}", [topic])
        for c in clients
        for size, topic in topics.items()
        for r in range(rounds)
    ]
    rates: dict[tuple[str, str, str], list[float]] = {}
    with running_mesh(bootstrap, log_dir) as mesh:
        assigner = mesh.assigner(groups)
        assigner.wait_serving()
        for r in range(rounds):
            for size, topic in topics.items():
                for c in clients:
                    m = through_mesh(mesh, assigner, c, f"g-{c.name}-{size}-{r}", counts[size])
                    d = timed(
                        c,
                        ["--direct", "--bootstrap", bootstrap, "--topic", topic,
                         "--group", f"d-{c.name}-{size}-{r}-{time.time_ns()}"],
                        counts[size],
                    )  # fmt: skip
                    rates.setdefault((c.name, size, "mesh"), []).append(m)
                    rates.setdefault((c.name, size, "direct"), []).append(d)
                    print(
                        f"round {r + 1}: {c.name} {size}: mesh {m:,.0f}/s, direct {d:,.0f}/s",
                        flush=True,
                    )
    print(
        f"\nrecords/s, {records:,} records of 100 B and {counts['1KiB']:,} of 1 KiB, "
        f"6 partitions, one sidecar; median of {rounds} interleaved rounds (best):"
    )
    for c in clients:
        for size in SIZES:
            print(
                summary(
                    c.name, size, rates[(c.name, size, "mesh")], rates[(c.name, size, "direct")]
                )
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default=",".join(READERS), help="comma-separated")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    args = parser.parse_args()
    unknown = set(args.clients.split(",")) - set(READERS)
    if unknown:
        parser.error(f"unknown clients {sorted(unknown)}; known: {sorted(READERS)}")
    clients = [READERS[name] for name in args.clients.split(",")]
    started = time.monotonic()
    with (
        bench_kafka(args.bootstrap, announce=True) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp,
    ):
        run(kafka.bootstrap, clients, args.records, args.rounds, Path(tmp))
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
