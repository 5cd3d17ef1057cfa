"""Benchmark: an application's memory with the Python client, beside a direct consumer
(issue 35; ARCHITECTURE §8.1 "Cost per pod").

    .venv/bin/python tests/bench/bench_client_rss.py [--rate R] [--seconds S] [--bootstrap B]

The application is the conformance reader, ``clients/python/dsread.py``, run two ways at
once on the same topic:

- **client**: through the mesh (one assigner, one sidecar), with the Python of the
  environment ``make client-python`` made: the client's wheel and nothing else of the
  project (``python -I``);
- **direct**: ``dsread --direct``, a confluent-kafka consumer in its own group, with the
  project's Python.

Both are started, bound and idle (**at rest**, S seconds with nothing produced), then read
while R records/s of 100 B are produced into 6 partitions (**at R/s**, S seconds). Each
process's resident set size (``VmRSS``) is sampled every half second; printed: the median
and the largest of each phase, and each process's RSS right after importing only its
library (``import dsclient`` in the client's environment, ``import confluent_kafka`` in
the project's). No number is asserted (CONVENTIONS "Tests"). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.devstack.kafka import create_topic, delete_topic
from tests.support.mesh import running_mesh
from tests.support.readers import CLIENT_PYTHON, DSREAD_PY
from tests.support.records import SeqProducer
from tests.support.sidecar_probe import start_sidecar

PARTITIONS = 6
SAMPLE_SECONDS = 0.5


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def import_only(python: list[str], module: str) -> float:
    """RSS in MiB of a process that has imported ``module`` and nothing else."""
    code = (
        f"import {module}, pathlib\n"
        "status = pathlib.Path('/proc/self/status').read_text().splitlines()\n"
        "print(next(int(l.split()[1]) for l in status if l.startswith('VmRSS:')))\n"
    )
    out = subprocess.run([*python, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def sample(procs: dict[str, subprocess.Popen[str]], seconds: float) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in procs}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}")
            samples[name].append(rss_mib(proc.pid))
        time.sleep(SAMPLE_SECONDS)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"))
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("--bootstrap (or KAFKA_BOOTSTRAP) is required")
    if not CLIENT_PYTHON.exists():
        sys.exit(f"{CLIENT_PYTHON} is missing: run `make client-python` first")
    client_python = [str(CLIENT_PYTHON), "-I"]
    project_python = [sys.executable]
    at_import = {
        "client": import_only(client_python, "dsclient"),
        "direct": import_only(project_python, "confluent_kafka"),
    }
    run = uuid.uuid4().hex[:6]
    topic, group = f"rss-{run}", f"g-rss-{run}"
    create_topic(args.bootstrap, topic, PARTITIONS)
    expect = str(10**9)  # never reached: the readers are stopped after the run
    with tempfile.TemporaryDirectory() as tmp, running_mesh(args.bootstrap, Path(tmp)) as mesh:
        assigner = mesh.assigner([(group, [topic])])
        assigner.wait_serving()
        start_sidecar(mesh, group, assigner, f"sc-rss-{run}").wait_serving()
        readers = {
            "client": [*client_python, DSREAD_PY, "--assigner", assigner.grpc_addr,
                       "--group", group, "--client-id", f"rss-{run}"],
            "direct": [*project_python, DSREAD_PY, "--direct", "--bootstrap", args.bootstrap,
                       "--topic", topic, "--group", f"d-rss-{run}"],
        }  # fmt: skip
        procs = {
            name: subprocess.Popen(
                [*argv, "--expect", expect, "--quiet", "--idle-exit-s", "600"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, argv in readers.items()
        }
        try:
            time.sleep(5)  # bound, subscribed, idle
            rest = sample(procs, args.seconds)
            producer = SeqProducer(args.bootstrap, topic, PARTITIONS, rate=args.rate).start()
            try:
                time.sleep(2)  # the flow reaches both readers
                busy = sample(procs, args.seconds)
            finally:
                producer.stop()
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
    delete_topic(args.bootstrap, topic)
    print(
        f"RSS in MiB (median / largest of {args.seconds:.0f} s sampled every {SAMPLE_SECONDS} s);"
        f" {args.rate:,.0f} records/s of 100 B, {PARTITIONS} partitions"
    )
    print(f"{'':8} {'imported':>9} {'at rest':>15} {f'at {args.rate:,.0f}/s':>15}")
    for name in readers:
        r, b = rest[name], busy[name]
        print(
            f"{name:8} {at_import[name]:9.1f} {statistics.median(r):7.1f} / {max(r):5.1f} "
            f"{statistics.median(b):7.1f} / {max(b):5.1f}"
        )
    ratio = statistics.median(busy["client"]) / statistics.median(busy["direct"])
    print(f"client / direct at {args.rate:,.0f}/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
