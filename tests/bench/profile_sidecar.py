"""Profile: where the sidecar path's CPU goes, per process and thread, with py-spy (native).

    pip install py-spy   # into the venv, once
    .venv/bin/python tests/bench/profile_sidecar.py [--size 100] [--records 600000]
                                                     [--rate 100] [--out DIR]

Starts a local 1-broker KafkaCluster, produces ``--records`` records of ``--size`` bytes
and reads them three ways, as ``bench_sidecar.py`` does: (a) the direct ``consume()`` loop,
(c) ``DsClient.stream`` over the Stream RPC with ``ack(batch)``, (b2) ``DsClient.fetch``
with ``ack_nowait(batch)``. While each runs, ``py-spy record --native`` samples the
application (this process) and the sidecar; afterwards it prints, for each run:

* the rate and the CPU seconds per million records of each process (``/proc``), and the
  sidecar's CPU split by thread kind (Python threads, librdkafka's, gRPC core's);
* the top frames, self and cumulative, of the samples that were on CPU (a sample waiting
  in epoll, a futex, a condition variable or a lock is left out), for the sidecar's fetch
  thread (``kafka-fetch``), its event loop (``MainThread``: the RPCs), and the
  application's threads.

The raw py-spy files (collapsed stacks, one per process and run) stay in ``--out`` for
flame graphs (``py-spy`` writes speedscope and SVG too: see its ``--format``). py-spy stops
a process for each native sample, so rates under the profiler are lower than
``bench_sidecar.py``'s: read the proportions, not the rates. A lease or visibility timeout
can run out while a process is stopped; acks refused for that are counted, not fatal.
Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dsclient import DsClient
from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic
from tests.bench.bench_sidecar import (
    FETCH_MAX,
    FETCH_MAX_BYTES,
    PARTITIONS,
    STREAM_CREDIT,
    CpuWindow,
    Rate,
    direct_consume,
    read_records,
)
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.sidecar_probe import produce_bulk, start_sidecar

TOP = 25
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
# A sample whose stack holds one of these is waiting, not on CPU.
_WAITING = re.compile(
    r"epoll_wait|epoll_pwait|^poll |pthread_cond_(timed)?wait|cnd_timedwait|"
    r"PyThread_acquire_lock_timed|_queue_SimpleQueue_get|sem_(timed)?wait|nanosleep|"
    r"select_epoll"
)
# ... or whose innermost frame is a bare futex call (gRPC core's waits, glibc's futex
# wait: an address in libc with no symbol, the same in every process on this machine).
_WAITING_LEAF = re.compile(r"^syscall \(libc|^__futex|^0x[0-9a-f]+ \(libc")


# ---- per-thread CPU ------------------------------------------------------------------------


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, by thread id, with its kind."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[f"{_kind(name)}/{tid}"] = (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND
    return out


def _kind(name: str) -> str:
    if name.startswith("rdk:"):
        return "librdkafka"
    if name.startswith(("grpc", "event_engine", "default-executo", "resolver", "timer")):
        return "gRPC core"
    return "Python"


def cpu_by_kind(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    kinds: collections.defaultdict[str, float] = collections.defaultdict(float)
    for key, used in after.items():
        kinds[key.split("/")[0]] += used - before.get(key, 0.0)
    return dict(kinds)


# ---- py-spy --------------------------------------------------------------------------------


def py_spy() -> str:
    """py-spy beside this Python (the venv's), or on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


@contextmanager
def sampled(pids: dict[str, int], out: Path, label: str, rate: int) -> Iterator[None]:
    """py-spy records each of ``pids`` (name → pid) into ``out/<label>-<name>.txt``."""
    spies = [
        subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(pid),
                "--native",
                "--threads",
                "--rate",
                str(rate),
                "--format",
                "raw",
                "-o",
                str(out / f"{label}-{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            spy.wait(60)


def top_frames(path: Path, threads: str, n: int = TOP) -> str:
    """The ``n`` top frames, self and cumulative, of the on-CPU samples of the threads
    whose name matches ``threads``, from py-spy's raw (collapsed) output."""
    self_counts: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    on_cpu = waiting = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        if not re.search(threads, thread) or not frames:
            continue
        frames = [_short(f) for f in frames]
        if any(map(_WAITING.search, frames)) or _WAITING_LEAF.search(frames[-1]):
            waiting += int(count)
            continue
        on_cpu += int(count)
        self_counts[frames[-1]] += int(count)
        for frame in set(frames):
            cumulative[frame] += int(count)
    lines = [f"  {path.name} threads /{threads}/: {on_cpu} samples on CPU, {waiting} waiting"]
    for title, counts in (("self", self_counts), ("cumulative", cumulative)):
        lines.append(f"  -- {title}")
        lines += [
            f"  {100 * c / max(on_cpu, 1):5.1f}%  {frame}" for frame, c in counts.most_common(n)
        ]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``fn (/long/path/to/file.py:12)`` as ``fn (file.py:12)``."""
    return re.sub(r" \((?:/[^)]*/)?([^/)]*)\)", r" (\1)", frame)


# ---- the runs --------------------------------------------------------------------------------


def through_sidecar(
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    n: int,
    read: Callable[[DsClient, int], tuple[int, int]],
    out: Path,
    label: str,
    rate: int,
) -> tuple[Rate, dict[str, float], int]:
    """``read`` (client, records) → (records read, records whose ack was refused) through a
    fresh sidecar, profiled; the rate, the sidecar's CPU by thread kind, the refusals."""
    sidecar = start_sidecar(mesh, group, assigner, f"prof-{group[-12:]}")
    sidecar.wait_serving()
    assert sidecar.pid is not None
    try:
        with (
            DsClient(group, client_id=f"prof-{label}", assigner=assigner.grpc_addr) as client,
            sampled({"sidecar": sidecar.pid, "app": os.getpid()}, out, label, rate),
        ):
            cpu = CpuWindow({"app": os.getpid(), "sidecar": sidecar.pid})
            threads = thread_cpu(sidecar.pid)
            cpu.start()
            started = time.monotonic()
            got, refused = read(client, n)
            took = time.monotonic() - started
            used = cpu.used()
            kinds = cpu_by_kind(threads, thread_cpu(sidecar.pid))
        return Rate(got, took, used), kinds, refused
    finally:
        sidecar.stop()


def stream_ack(client: DsClient, n: int) -> tuple[int, int]:
    got = refused = 0
    for batch in client.stream(STREAM_CREDIT, use_stream_rpc=True):
        read = read_records(batch)
        refused += read - client.ack(batch)
        got += read
        if got >= n:
            break
    return got, refused


def fetch_ack_nowait(client: DsClient, n: int) -> tuple[int, int]:
    got = 0
    pending = []
    deadline = time.monotonic() + 300
    while got < n and time.monotonic() < deadline:
        batch = client.fetch(FETCH_MAX, max_wait=1.0, max_bytes=FETCH_MAX_BYTES)
        if batch:
            read = read_records(batch)
            pending.append((client.ack_nowait(batch), read))
            got += read
    return got, sum(read - future.result(timeout=60) for future, read in pending)


def run(bootstrap: str, size: int, n: int, rate: int, out: Path, log_dir: Path) -> None:
    topic = f"prof-sidecar-{size}-{uuid.uuid4().hex[:6]}"
    groups = [(f"g-{mode}-{topic}", [topic]) for mode in ("stream", "fetchnw")]
    create_topic(bootstrap, topic, PARTITIONS)
    took = produce_bulk(bootstrap, topic, n, size, PARTITIONS)
    print(f"== {n} records x {size} B (produced in {took:.1f}s), py-spy --native at {rate} Hz")
    with sampled({"app": os.getpid()}, out, "direct", rate):
        base = direct_consume(bootstrap, topic, n)
    print(f"(a)  direct consume() loop  {base}\n     ({base.cpu_line()})")
    print(top_frames(out / "direct-app.txt", "MainThread"))
    with running_mesh(bootstrap, log_dir) as mesh:
        assigner = mesh.assigner(groups)
        assigner.wait_serving()
        for label, mode, read in (
            ("stream", "(c)  Stream + ack         ", stream_ack),
            ("fetchnw", "(b2) Fetch + ack_nowait   ", fetch_ack_nowait),
        ):
            measured, kinds, refused = through_sidecar(
                mesh, assigner, f"g-{label}-{topic}", n, read, out, label, rate
            )
            split = ", ".join(f"{kind} {used:.2f}" for kind, used in sorted(kinds.items()))
            print(f"\n{mode}{measured}\n     ({measured.cpu_line()})")
            print(f"     sidecar CPU s by thread kind: {split}; acks refused: {refused}")
            for path, threads in (
                (out / f"{label}-sidecar.txt", "kafka-fetch"),
                (out / f"{label}-sidecar.txt", "MainThread"),
                (out / f"{label}-app.txt", "."),
            ):
                print(top_frames(path, threads))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100, help="record value bytes")
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, help="where py-spy's files go (default: a temp dir)")
    args = parser.parse_args()
    if shutil.which(py_spy()) is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-sidecar-"))
    out.mkdir(parents=True, exist_ok=True)
    cluster = KafkaCluster(KafkaOptions(brokers=1)).start()
    try:
        with tempfile.TemporaryDirectory(prefix="profile-sidecar-logs-") as logs:
            run(cluster.bootstrap, args.size, args.records, args.rate, out, Path(logs))
    finally:
        cluster.stop()
    print(f"\npy-spy raw files in {out}; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
