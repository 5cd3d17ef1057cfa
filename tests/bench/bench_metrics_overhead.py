"""Benchmark: what the sidecar's metrics cost its delivery throughput (issue 6, ≤ 5 %).

    .venv/bin/python tests/bench/bench_metrics_overhead.py [--short] [--bootstrap HOST:PORT]

Produces N records of 100 B over 8 partitions once, then reads them all through a fresh
sidecar and group with ``Stream`` (``DsClient.stream(use_stream_rpc=True)``, credit 20,000,
every record's key, value and offset read, one ack per batch), alternating two settings in
the same run:

* ON: the defaults — librdkafka statistics every 5000 ms, every metric hook installed
  (consumption counts per partition run, polls, commits, client access, record age);
* OFF: ``DS_STATISTICS_INTERVAL_MS=0`` and ``DS_METRICS_ENABLED=false`` (no statistics,
  no hooks; only the scrape-time views remain, which cost nothing unless scraped).

Rates run from the first batch to the last (steady state). A shared machine makes single
runs noisy, so each setting runs ROUNDS times, interleaved; the best of each is kept (as
``timeit`` does), and the median ratio is printed too. Beside the rates, the sidecar's own
CPU time (user + system, from the kernel) per record over the same stretch: what the
metrics cost the sidecar, much less swayed by what else the machine runs than a rate is
(ON/OFF of the medians). Never asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dsclient import DsClient
from services.devstack.kafka import create_topic, delete_topic
from tests.bench.bench_sidecar import (
    PARTITIONS,
    STREAM_CREDIT,
    Rate,
    best,
    read_records,
    serving_sidecar,
)
from tests.support.bench_kafka import bench_kafka
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.sidecar_probe import produce_bulk

ON: dict[str, str] = {}
OFF = {"DS_STATISTICS_INTERVAL_MS": "0", "DS_METRICS_ENABLED": "false"}
SHORT = (300_000, 3)  # records, rounds per setting
FULL = (1_000_000, 5)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def stream_rate(
    mesh: Mesh, assigner: ServiceProcess, group: str, n: int, env: dict[str, str]
) -> tuple[Rate, float]:
    """The steady-state rate, and the sidecar's CPU seconds per record over it."""
    sidecar, started = serving_sidecar(mesh, assigner, group, env)
    assert sidecar.pid is not None
    process = psutil.Process(sidecar.pid)
    cpu_at_first = 0.0
    got = 0
    first: float | None = None
    client = DsClient(group, client_id="bench-metrics", assigner=assigner.grpc_addr)
    watchdog = threading.Timer(300, client.close)
    watchdog.start()
    try:
        for batch in client.stream(STREAM_CREDIT, use_stream_rpc=True):
            read = read_records(batch)
            if client.ack(batch) != read:
                raise RuntimeError("a batch was not acked whole")
            if first is None:
                first = time.monotonic()  # the first batch starts the clock, uncounted
                cpu_at_first = _cpu_seconds(process)
                n -= read
            else:
                got += read
            if got >= n:
                break
        cpu = _cpu_seconds(process) - cpu_at_first
        return Rate(got, time.monotonic() - (first or started)), cpu / max(got, 1)
    finally:
        watchdog.cancel()
        client.close()
        sidecar.stop()


def run(bootstrap: str, records: int, rounds: int, log_dir: Path) -> None:
    topic = f"bench-metrics-{uuid.uuid4().hex[:6]}"
    settings = {"on": ON, "off": OFF}
    groups = [(f"g-{name}{i}-{topic}", [topic]) for i in range(rounds) for name in settings]
    create_topic(bootstrap, topic, PARTITIONS)
    try:
        took = produce_bulk(bootstrap, topic, records, 100, PARTITIONS)
        print(f"{records} records x 100 B over {PARTITIONS} partitions (produced in {took:.1f}s)")
        print(f"ON: defaults (statistics 5000 ms, every hook); OFF: {OFF}")
        rates: dict[str, list[Rate]] = {name: [] for name in settings}
        cpu: dict[str, list[float]] = {name: [] for name in settings}  # seconds per record
        with running_mesh(bootstrap, log_dir) as mesh:
            assigner = mesh.assigner(groups)
            assigner.wait_serving()
            for i in range(rounds):
                # Alternate which goes first, so neither always gets the warmer machine.
                order = list(settings) if i % 2 == 0 else list(reversed(settings))
                for name in order:
                    group = f"g-{name}{i}-{topic}"
                    rate, per_record = stream_rate(mesh, assigner, group, records, settings[name])
                    rates[name].append(rate)
                    cpu[name].append(per_record)
                print(
                    f"  round {i + 1}: ON {rates['on'][-1].per_second:,.0f}  "
                    f"OFF {rates['off'][-1].per_second:,.0f} rec/s; sidecar CPU per record "
                    f"ON {cpu['on'][-1] * 1e6:.2f}  OFF {cpu['off'][-1] * 1e6:.2f} us",
                    flush=True,
                )
        on, off = best(rates["on"]), best(rates["off"])
        ratios = [
            a.per_second / b.per_second for a, b in zip(rates["on"], rates["off"], strict=True)
        ]
        print(f"metrics ON  (best of {rounds}) {on}")
        print(f"metrics OFF (best of {rounds}) {off}")
        ratio = on.per_second / off.per_second
        print(
            f"ratio ON/OFF: best {ratio:.3f}, median of rounds {statistics.median(ratios):.3f} "
            f"(overhead of the best: {100 * (1 - ratio):.1f} %)"
        )
        on_cpu, off_cpu = statistics.median(cpu["on"]), statistics.median(cpu["off"])
        print(
            f"sidecar CPU per record, median of rounds: ON {on_cpu * 1e6:.2f} us, "
            f"OFF {off_cpu * 1e6:.2f} us, ON/OFF {on_cpu / off_cpu:.3f} (best ON "
            f"{min(cpu['on']) * 1e6:.2f}, best OFF {min(cpu['off']) * 1e6:.2f} us)"
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
        bench_kafka(args.bootstrap) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp,
    ):
        run(kafka.bootstrap, records, rounds, Path(tmp))
    print(f"total {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
