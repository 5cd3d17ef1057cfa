"""Benchmark: what a pod pays for the mesh at the rates services really run (issue 34).

    .venv/bin/python tests/bench/bench_pod_cost.py [--short] [--bootstrap HOST:PORT]
        [--rates 0,10,100,1000,10000] [--sizes 100,1024] [--paths S,F,Sl,Su,Fu,Cu]
        [--rounds N] [--window SECONDS] [--json PATH [--label TEXT]]
        [--ordering key|partition --keys N] [--share | --no-share] [--floor | --no-floor]

One producer process writes ``rate`` records/s (each value ``seq:time_ns:`` padded to the
record size) to a topic of its own per size. In the same window, each in a process of its
own, reading the same records from the end:

(dc) a direct confluent-kafka consumer, ``assign()``, ``poll(1.0)`` then what is already
     fetched (``consume(999, 0)``), and a synchronous ``commit()`` after each batch: the
     sidecar's guarantee (a batch is committed once acked), the baseline of the ratios;
(da) the same with ``enable.auto.commit`` (librdkafka's default, every 5 s), ``poll(1.0)``
     per record;
(ds) a Kafka share group (KIP-932) read by the Java client's ``KafkaShareConsumer``
     (``dsread --share``: ``commitSync()`` per batch acknowledges its records), Kafka's own
     per-record delivery, with ``--share`` (the full profile; it needs ``make client-java``;
     every reader then reads 30 s at 1,000 records/s before the first window, the JVM's
     warm-up);
(S), (F) ``DsClient.stream(use_stream_rpc=True)`` / ``DsClient.fetch`` over TCP, through a
     sidecar of its own; (Sl) ``stream`` with a 50 ms linger (``StreamOpen.linger``:
     records arriving one by one share a message); (Slf) the same, its group's consumer
     config holding the sidecar's fetches up to 50 ms; (Su), (Fu) the same over the
     sidecar's Unix domain socket; (Sulf), (Fuf) Slf's trade over the socket (Fuf: held
     fetches only); (Cu) ``stream_columns`` over the socket (``ARROW_SHM``); (Sug), (Cug)
     Su and Cu without the frame socket: each batch acked with ``ack_nowait`` and every
     answer checked at the end (the loops of ``bench_sidecar``'s latency row, whose code
     they run);
(dr) with ``--floor`` (the full profile): a bare Python relay and its reader
     (``tests/support/relay_floor.py``), the least a sidecar in Python can cost.

Every process does the same per-record work (parse the stamp, keep the first arrival).
Before any client attaches, the sidecars, the assigner and the notifier are measured idle
(no client, no traffic). Then, per rate (0: clients attached, no traffic), after a
warm-up, ``rounds`` windows: per process its CPU (cores, ``/proc/PID/stat``), RSS
(``VmRSS``) and wake-ups per second (voluntary context switches of all its threads), and
per path p50/p99 latency from produce to the application. Each figure is printed as the
median of the rounds and the best (lowest CPU / latency), the mesh's CPU (sidecar +
application) as a ratio to (dc)'s and (da)'s in the same round; the load average beside
each rate. ``--json`` writes every figure (docs/benchmarks/results/pod_cost.json) as the run
``--label`` names, beside the file's other runs.

``--ordering key`` (issue 39): the producer keys its records (``--keys`` keys, each in one
partition), and every mesh path runs twice in the same window, through two sidecars and
groups of the same topic: its group ``unordered`` (S, F, ...) and in the ordering given
(Sk, Fk, ...; Sp, ... for ``partition``); each ordered path's CPU is also printed as a
ratio to its unordered twin's in the same round (median and best), with both latencies.
Not collected by pytest (file name); never asserts a time.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Light imports only: every reader process (spawn) imports this module again, and its
# RSS is one of the figures. The mesh's helpers are imported where they are used.
from tests.support import pod_readers
from tests.support.pod_readers import Arrivals, Reader, produce, read
from tests.support.proc_usage import Usage, UsageRate, read_threads, read_usage, usage_rate

if TYPE_CHECKING:
    from tests.support.mesh import Mesh, ServiceProcess

PARTITIONS = 4
WARM_SECONDS = 3.0
DRAIN_SECONDS = 3.0
# A reader's start (a DsClient binds through the assigner to a sidecar that holds leases):
# on a machine loaded 10-20 deep it took more than two minutes.
START_SECONDS = 300.0
# key → (label, reader kind, over the sidecar's Unix domain socket)
MESH_PATHS = {
    "S": ("DsClient.stream (Stream RPC) TCP", "stream", False),
    "F": ("DsClient.fetch TCP", "fetch", False),
    "Sl": ("DsClient.stream (Stream RPC) TCP, linger 50 ms", "stream-linger", False),
    "Slf": ("Sl, group fetch.wait.max.ms 50, fetch.min.bytes 1 MiB", "stream-linger", False),
    "Su": ("DsClient.stream (Stream RPC) UDS", "stream", True),
    "Fu": ("DsClient.fetch UDS", "fetch", True),
    "Cu": ("DsClient.stream_columns UDS (ARROW_SHM)", "columns", True),
    # The low-rate trade over the socket: linger and held fetches (Slf's), and held fetches
    # under Fetch.
    "Sulf": (
        "Su, linger 50 ms, group fetch.wait.max.ms 50, fetch.min.bytes 1 MiB",
        "stream-linger",
        True,
    ),
    "Fuf": ("Fu, group fetch.wait.max.ms 50, fetch.min.bytes 1 MiB", "fetch", True),
    # Su and Cu as before the frame socket: every Stream message a gRPC message.
    "Sug": ("DsClient.stream (Stream RPC) UDS, no frame socket", "stream-grpc", True),
    "Cug": ("DsClient.stream_columns UDS (ARROW_SHM), no frame socket", "columns-grpc", True),
}
# A path's group settings (the assigner's YAML keys): Slf's group has the broker hold its
# sidecar's fetches up to 50 ms (a live-configurable consumer property, `dsctl config set`),
# so the fetch loop wakes per 50 ms of records, not per record.
HELD_FETCHES = {
    "consumer_config": "{"
    + ", ".join(f"{k}: '{v}'" for k, v in pod_readers.HELD_FETCHES.items())
    + "}"
}
PATH_GROUP_SETTINGS = {"Slf": HELD_FETCHES, "Sulf": HELD_FETCHES, "Fuf": HELD_FETCHES}
# An ordered twin of a mesh path (--ordering): the path's key with this suffix.
ORDERED_SUFFIX = {"key": "k", "partition": "p"}
DIRECT_PATHS = {"dc": ("direct, commit per batch", "commit"), "da": ("direct, auto-commit", "auto")}
# With a path of the low-rate trade (held fetches): the direct consumer given the same fetches.
HELD_DIRECT = "dcf"
HELD_DIRECT_LABEL = "dc, fetch.wait.max.ms 50, fetch.min.bytes 1 MiB"
# Each direct path's reader kind (tests/support/pod_readers.py).
DIRECT_KINDS = {**{k: kind for k, (_, kind) in DIRECT_PATHS.items()}, HELD_DIRECT: "commit-held"}
SHARE_PATH = "ds"
# --floor: the least a sidecar in Python can cost (tests/support/relay_floor.py): a bare relay
# (poll, one frame per batch on a Unix socket, the reader's ack, a synchronous commit) and
# its reader; the relay's figures in the "sidecar" columns.
FLOOR_PATH = "dr"
FLOOR_LABEL = "floor: bare Python relay, frames on UDS, commit per ack"
SHARE_LABEL = "share group (KIP-932), Java, commitSync per batch"
JIT_WARM_RATE, JIT_WARM_SECONDS = 1000.0, 30.0  # with the share consumer, before measuring
JSON_DEFAULT = Path(__file__).resolve().parents[2] / "docs/benchmarks/results/pod_cost.json"


@dataclass(frozen=True)
class Profile:
    rates: tuple[float, ...]
    sizes: tuple[int, ...]
    paths: tuple[str, ...]
    rounds: int
    window: float  # seconds per round
    idle_window: float
    ordering: str = ""  # --ordering: each mesh path also runs in this mode ("": none)
    keys: int = 0  # the producer's keys (0: no key)
    share: bool = False  # also (ds): a share-group consumer (the Java dsread --share)
    threads: bool = False  # print each mesh process's threads in each rate's first round
    floor: bool = False  # also (dr): the bare relay, the floor of a Python sidecar

    @property
    def run_paths(self) -> tuple[str, ...]:
        """The mesh paths run: ``paths``, and their ordered twins with ``ordering``."""
        if not self.ordering:
            return self.paths
        suffix = ORDERED_SUFFIX[self.ordering]
        return self.paths + tuple(p + suffix for p in self.paths)

    @property
    def direct_paths(self) -> tuple[str, ...]:
        """The baselines run: the direct consumers, and the share consumer with ``share``."""
        held = any(PATH_GROUP_SETTINGS.get(p) == HELD_FETCHES for p in self.paths)
        return (
            *DIRECT_PATHS,
            *((HELD_DIRECT,) if held else ()),
            *((SHARE_PATH,) if self.share else ()),
            *((FLOOR_PATH,) if self.floor else ()),
        )


FULL = Profile(
    (0, 10, 100, 1000, 10_000),
    (100, 1024),
    ("S", "F", "Su", "Fu", "Cu"),
    3,
    20,
    30,
    share=True,
    floor=True,
)
# CI: a minute or two on a shared 2-core machine.
SHORT = Profile((100, 1000), (100, 1024), ("S", "F"), 2, 5, 10)


# ---- pure parts --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median_and_best(values: list[float]) -> tuple[float, float]:
    """The median of the rounds and the best (lowest: CPU, latency, wake-ups)."""
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), min(values)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def mesh_path(key: str) -> tuple[str, str, bool]:
    """(label, reader kind, over UDS) of a mesh path or of its ordered twin."""
    if key in MESH_PATHS:
        return MESH_PATHS[key]
    mode = next(m for m, x in ORDERED_SUFFIX.items() if key.endswith(x))
    label, kind, uds = MESH_PATHS[key[: -len(ORDERED_SUFFIX[mode])]]
    return f"{label}, {mode}", kind, uds


def twin_of(key: str) -> str | None:
    """The unordered path an ordered twin is compared with (None: not a twin)."""
    return None if key in MESH_PATHS else key[:-1]


@dataclass(frozen=True)
class Round:
    """One window of one rate: per path and process its usage; per path its latency."""

    seconds: float
    load: tuple[float, float, float]
    usage: dict[str, dict[str, UsageRate]]  # path → process ("app", "sidecar") → usage
    p50_ms: dict[str, float] = field(default_factory=dict)
    p99_ms: dict[str, float] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)
    produced: float = 0.0  # records/s the producer wrote in the window (did it keep up?)

    def cores(self, path: str) -> float:
        return sum(u.cores for u in self.usage[path].values())


def path_summary(rounds: list[Round], path: str, base: str) -> dict[str, Any]:
    """A path's figures over the rounds: each process's cores, wake-ups/s and RSS, the
    path's total cores and its ratio to ``base``'s in the same round (median and best),
    p50/p99 latency (median and best)."""
    out: dict[str, Any] = {}
    for name in rounds[0].usage[path]:
        cores = [r.usage[path][name].cores for r in rounds]
        wakeups = [r.usage[path][name].wakeups for r in rounds]
        out[name] = {
            "cores": median_and_best(cores),
            "wakeups_per_s": median_and_best(wakeups),
            "rss_mib": max(r.usage[path][name].rss for r in rounds) / 2**20,
        }
    out["total_cores"] = median_and_best([r.cores(path) for r in rounds])
    out["ratio"] = median_and_best([ratio(r.cores(path), r.cores(base)) for r in rounds])
    if all(path in r.p99_ms for r in rounds):
        out["p50_ms"] = median_and_best([r.p50_ms[path] for r in rounds])
        out["p99_ms"] = median_and_best([r.p99_ms[path] for r in rounds])
        out["missed"] = sum(r.missed.get(path, 0) for r in rounds)
    return out


# ---- the run --------------------------------------------------------------------------------


@dataclass
class Size:
    """One size's run: each rate's rounds, and each path's latency by record."""

    size: int
    idle: dict[str, dict[str, Any]] = field(default_factory=dict)
    rates: dict[float, list[Round]] = field(default_factory=dict)


def started_pid(process: ServiceProcess) -> int:
    """The pid of a started service (``ServiceProcess.pid`` is None only before start)."""
    assert process.pid is not None, f"the {process.kind} was not started"
    return process.pid


def measure(
    pids: dict[str, dict[str, int]], seconds: float, threads: dict[str, int] | None = None
) -> dict[str, dict[str, UsageRate]]:
    """Every process's usage over the next ``seconds``; and per thread of the ``threads``
    processes (name: pid), printed (where the idle wake-ups come from)."""
    before = {p: {n: read_usage(pid) for n, pid in names.items()} for p, names in pids.items()}
    threads_before = {n: read_threads(pid) for n, pid in (threads or {}).items()}
    started = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    for name, pid in (threads or {}).items():
        print_threads(name, threads_before[name], read_threads(pid), took)
    return {
        p: {n: usage_rate(before[p][n], read_usage(pid), took) for n, pid in names.items()}
        for p, names in pids.items()
    }


def mesh_threads(pids: dict[str, dict[str, int]], paths: tuple[str, ...]) -> dict[str, int]:
    """The processes of the mesh ``paths``, by ``PATH app`` / ``PATH sidecar`` (``--threads``)."""
    return {f"{p} {name}": pid for p in paths for name, pid in pids[p].items() if pid}


def print_threads(
    name: str, before: dict[str, Usage], after: dict[str, Usage], seconds: float
) -> None:
    rates = {t: usage_rate(before[t], u, seconds) for t, u in after.items() if t in before}
    busiest = sorted(rates.items(), key=lambda kv: -kv[1].wakeups)
    print(f"   {name} per thread (wake-ups/s, % of a core): " + ", ".join(
        f"{t} {u.wakeups:.1f} {u.cores * 100:.2f}" for t, u in busiest if u.wakeups or u.cores
    ), flush=True)  # fmt: skip


def sidecar_args(notifier: ServiceProcess) -> tuple[str, ...]:
    # The production log format (the mesh helpers start services with the dev console).
    return ("--log-format", "json", "--notifier", notifier.grpc_addr)


def run_size(
    mesh: Mesh,
    assigner: ServiceProcess,
    notifier: ServiceProcess,
    bootstrap: str,
    size: int,
    profile: Profile,
    socket_dir: Path,
    groups: dict[str, str],
    topic: str,
    log_dir: Path,
) -> Size:
    from tests.bench.bench_sidecar import check_transport
    from tests.support import share_reader
    from tests.support.relay_floor import relay
    from tests.support.sidecar_probe import start_sidecar

    ctx = multiprocessing.get_context("spawn")
    stop, stop_producer = ctx.Event(), ctx.Event()
    out = ctx.Queue()
    rate, sent = ctx.Value("d", 0.0), ctx.Value("q", 0)
    result = Size(size)
    sidecars: dict[str, ServiceProcess] = {}
    procs: list[Any] = []
    firsts: dict[str, Any] = {}
    pids: dict[str, dict[str, int]] = {}
    share: subprocess.Popen[bytes] | None = None
    relay_proc: Any = None
    share_out = log_dir / f"share-{size}.out"
    try:
        for key in profile.run_paths:
            env = {"DS_UDS_DIR": str(socket_dir)} if mesh_path(key)[2] else {}
            sidecar = start_sidecar(
                mesh, groups[key], assigner, f"pod-{uuid.uuid4().hex[:10]}",
                *sidecar_args(notifier), env=env,
            )  # fmt: skip
            sidecars[key] = sidecar
        for sidecar in sidecars.values():
            sidecar.wait_serving()
        idle_pids = {f"sidecar-{k}": {"sidecar": s.pid} for k, s in sidecars.items()}
        idle_pids["assigner"] = {"assigner": assigner.pid}
        idle_pids["notifier"] = {"notifier": notifier.pid}
        time.sleep(WARM_SECONDS)
        load = os.getloadavg()
        first = next(iter(sidecars))
        per_thread = {
            f"sidecar-{first}": started_pid(sidecars[first]),
            "assigner": started_pid(assigner),
            "notifier": started_pid(notifier),
        }
        idle = measure({k: {n: p for n, p in v.items() if p} for k, v in idle_pids.items()},
                       profile.idle_window, per_thread)  # fmt: skip
        result.idle = {
            k: {"load": load, **{n: asdict(u) for n, u in v.items()}} for k, v in idle.items()
        }
        print_idle(size, idle, load, len(sidecars))
        readers = [
            Reader(k, DIRECT_KINDS[k], bootstrap=bootstrap, topic=topic, partitions=PARTITIONS)
            for k in profile.direct_paths
            if k in DIRECT_KINDS
        ]
        readers += [
            Reader(k, mesh_path(k)[1], group=groups[k], assigner=assigner.grpc_addr)
            for k in profile.run_paths
        ]
        if profile.floor:
            relay_socket = str(socket_dir / f"floor-{size}.sock")
            relay_proc = ctx.Process(
                target=relay, args=(bootstrap, topic, PARTITIONS, relay_socket, stop)
            )
            relay_proc.daemon = True
            relay_proc.start()
            readers.append(Reader(FLOOR_PATH, "relay", socket=relay_socket))
        for reader in readers:
            key = reader.key
            ready, firsts[key] = ctx.Event(), ctx.Event()
            proc = ctx.Process(target=read, args=(reader, ready, firsts[key], stop, out))
            proc.daemon = True
            proc.start()
            procs.append(proc)
            pids[key] = {"app": proc.pid or 0}
            if key in sidecars:
                pids[key]["sidecar"] = sidecars[key].pid or 0
            if key == FLOOR_PATH:
                pids[key]["sidecar"] = relay_proc.pid or 0
            if not started(ready, proc, out):
                raise RuntimeError(f"({key}) did not start: {failure(out)}")
        if profile.share:
            with (
                share_out.open("wb") as out_file,
                (log_dir / f"share-{size}.log").open("wb") as log,
            ):
                share = share_reader.start(
                    bootstrap, topic, f"bench-pod-ds-{uuid.uuid4().hex[:8]}", out_file, log
                )
            pids[SHARE_PATH] = {"app": share.pid}
        producer = ctx.Process(
            target=produce,
            args=(bootstrap, topic, PARTITIONS, size, rate, stop_producer, sent, profile.keys),
        )
        producer.daemon = True
        producer.start()
        rate.value = 10.0
        for key, event in firsts.items():
            if not event.wait(START_SECONDS):
                raise RuntimeError(f"({key}) received no record in {START_SECONDS:.0f} s")
        if share is not None:
            wait_for_share(share, share_out, log_dir / f"share-{size}.log")
            # The JVM compiles its hot paths as they run: until then a rate costs it several
            # times what it will (measured: 254 millicores at 100 records/s right after start,
            # 72 at 1,000 a minute later). Every reader reads this phase; none is measured.
            rate.value = JIT_WARM_RATE
            time.sleep(JIT_WARM_SECONDS)
        windows: dict[float, list[tuple[range, Round]]] = {}
        watched = mesh_threads(pids, profile.run_paths) if profile.threads else None
        for r in profile.rates:
            rate.value = float(r)
            time.sleep(WARM_SECONDS)
            windows[r] = []
            for i in range(profile.rounds):
                start, load = sent.value, os.getloadavg()
                usage = measure(pids, profile.window, watched if i == 0 else None)
                windows[r].append((range(start, sent.value), Round(profile.window, load, usage)))
            print(f"   {size} B at {r:g} rec/s measured (load {os.getloadavg()[0]:.2f})",
                  flush=True)  # fmt: skip
        stop_producer.set()
        producer.join(30)
        time.sleep(DRAIN_SECONDS)
        stop.set()
        seen: dict[str, Arrivals] = {}
        for _ in readers:
            key, got = out.get(timeout=120)
            if got.error:
                raise RuntimeError(f"({key}) failed: {got.error}")
            seen[key] = got
        if share is not None:
            share_reader.stop(share)
            got = share_reader.arrivals(share_out.read_text().splitlines())
            if got.error:
                raise RuntimeError(f"({SHARE_PATH}) failed: {got.error}")
            seen[SHARE_PATH] = got
        for key in profile.run_paths:
            check_transport(sidecars[key], f"bench-pod-{key}", uds=mesh_path(key)[2])
        for r, rounds in windows.items():
            result.rates[r] = [with_latency(rnd, seqs, seen) for seqs, rnd in rounds]
        return result
    finally:
        stop.set()
        stop_producer.set()
        for proc in procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
        if relay_proc is not None:
            relay_proc.join(15)
            if relay_proc.is_alive():
                relay_proc.kill()
        for sidecar in sidecars.values():
            sidecar.stop()
        if share is not None:
            share_reader.stop(share)


def wait_for_share(share: subprocess.Popen[bytes], out: Path, log: Path) -> None:
    """Until the share reader has read a record (it joins its share group after start)."""
    from tests.support import share_reader

    deadline = time.monotonic() + START_SECONDS
    while not share_reader.has_received(out):
        if share.poll() is not None:
            raise RuntimeError(f"({SHARE_PATH}) ended: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"({SHARE_PATH}) received no record in {START_SECONDS:.0f} s")
        time.sleep(0.5)


def started(ready: Any, proc: Any, out: Any) -> bool:
    """Whether a reader process signalled it is ready; False as soon as it ended without
    (its error is on ``out``), or after :data:`START_SECONDS`."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if ready.wait(1.0):
            return True
        if not proc.is_alive():
            return bool(ready.is_set())
    return False


def failure(out: Any) -> str:
    """What a reader that failed to start put on ``out``, if anything."""
    try:
        key, got = out.get(timeout=5)
    except Exception:  # nothing came: it is still trying (a DsClient binding)
        return f"not ready within {START_SECONDS:.0f} s"
    return f"({key}) {got.error or 'ended'}"


def with_latency(rnd: Round, seqs: range, seen: dict[str, Arrivals]) -> Round:
    """The round with each path's p50/p99 and missed records over the records produced
    in its window."""
    p50, p99, missed = {}, {}, {}
    for key, got in seen.items():
        values = [got.first_ms[s] for s in seqs if s in got.first_ms]
        p50[key], p99[key] = percentile(values, 0.5), percentile(values, 0.99)
        missed[key] = len(seqs) - len(values)
    produced = len(seqs) / rnd.seconds
    return replace(rnd, p50_ms=p50, p99_ms=p99, missed=missed, produced=produced)


# ---- printing -------------------------------------------------------------------------------


def print_idle(
    size: int, idle: dict[str, dict[str, UsageRate]], load: tuple[float, ...], n: int
) -> None:
    print(f"\n== idle, no client, no traffic ({n} sidecars attached; load {load[0]:.2f})")
    for key, names in idle.items():
        for name, u in names.items():
            print(
                f"   {key:12} {name:9} {u.cores * 100:6.2f} % of a core  "
                f"{u.wakeups:7.1f} wake-ups/s  RSS {u.rss / 2**20:6.1f} MiB",
                flush=True,
            )


def fmt(pair: tuple[float, float], scale: float = 1.0, spec: str = "6.1f") -> str:
    return f"{pair[0] * scale:{spec}} / {pair[1] * scale:{spec}}"


def print_size(result: Size, paths: tuple[str, ...], direct: tuple[str, ...]) -> None:
    labels = {k: v[0] for k, v in DIRECT_PATHS.items()} | {k: mesh_path(k)[0] for k in paths}
    labels[SHARE_PATH] = SHARE_LABEL
    labels[FLOOR_PATH] = FLOOR_LABEL
    labels[HELD_DIRECT] = HELD_DIRECT_LABEL
    for r, rounds in result.rates.items():
        loads = ", ".join(f"{rnd.load[0]:.2f}" for rnd in rounds)
        made = ", ".join(f"{rnd.produced:.0f}" for rnd in rounds)
        print(f"\n== {result.size} B at {r:g} records/s ({made} produced), {len(rounds)} rounds "
              f"(load average at each: {loads}); median / best")  # fmt: skip
        width = max(35, *(len(labels[k]) for k in paths))
        print(
            f"   {'path':{width + 5}} {'mcores app':>15} {'sidecar':>15} {'total':>15} "
            f"{'x dc':>11} {'x da':>11} {'wakeups/s app':>15} {'sidecar':>15} "
            f"{'RSS app':>8} {'sidecar':>8} {'p50 ms':>13} {'p99 ms':>13}"
        )
        for key in (*direct, *paths):
            s = path_summary(rounds, key, "dc")
            da = path_summary(rounds, key, "da")["ratio"]
            side = s.get("sidecar")
            print(
                f"   {f'({key}) {labels[key]}':{width + 5}} "
                f"{fmt(s['app']['cores'], 1000, '6.0f')} "
                f"{fmt(side['cores'], 1000, '6.0f') if side else '':>15} "
                f"{fmt(s['total_cores'], 1000, '6.0f')} {fmt(s['ratio'], 1, '4.1f')} "
                f"{fmt(da, 1, '4.1f')} {fmt(s['app']['wakeups_per_s'], 1, '6.0f')} "
                f"{fmt(side['wakeups_per_s'], 1, '6.0f') if side else '':>15} "
                f"{s['app']['rss_mib']:8.1f} {side['rss_mib'] if side else float('nan'):8.1f} "
                f"{fmt(s['p50_ms'], 1, '5.1f')} {fmt(s['p99_ms'], 1, '5.1f')}"
                + (f"  missed {s['missed']}" if s["missed"] else ""),
                flush=True,
            )
        for key in paths:
            if (twin := twin_of(key)) is None:
                continue
            s, base = path_summary(rounds, key, twin), path_summary(rounds, twin, "dc")
            print(
                f"   ({key}) over ({twin}), same rounds: CPU x {fmt(s['ratio'], 1, '4.2f')} "
                f"(total mcores {fmt(s['total_cores'], 1000, '4.0f')} against "
                f"{fmt(base['total_cores'], 1000, '4.0f')}), sidecar mcores "
                f"{fmt(s['sidecar']['cores'], 1000, '4.0f')} against "
                f"{fmt(base['sidecar']['cores'], 1000, '4.0f')}, p50 ms "
                f"{fmt(s['p50_ms'], 1, '5.1f')} against {fmt(base['p50_ms'], 1, '5.1f')}, "
                f"p99 ms {fmt(s['p99_ms'], 1, '5.1f')} against {fmt(base['p99_ms'], 1, '5.1f')}",
                flush=True,
            )


def as_json(results: list[Size], profile: Profile, started: str) -> dict[str, Any]:
    return {
        "bench": "bench_pod_cost",
        "date": started,
        "machine": {
            "host": socket.gethostname(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "load_average_end": os.getloadavg(),
        "profile": asdict(profile),
        "sizes": [
            {
                "size": res.size,
                "idle": res.idle,
                "rates": [
                    {
                        "rate": r,
                        "load_averages": [rnd.load for rnd in rounds],
                        "produced_per_s": [rnd.produced for rnd in rounds],
                        "paths": {
                            key: path_summary(rounds, key, "dc")
                            for key in (*profile.direct_paths, *profile.run_paths)
                        },
                        "over_unordered": {
                            key: path_summary(rounds, key, twin)["ratio"]
                            for key in profile.run_paths
                            if (twin := twin_of(key)) is not None
                        },
                    }
                    for r, rounds in res.rates.items()
                ],
            }
            for res in results
        ],
    }


def run(
    bootstrap: str, profile: Profile, log_dir: Path, done: Callable[[list[Size]], None]
) -> list[Size]:
    """Every size in turn; ``done`` is given the results so far after each (the JSON is
    written as they come, so a size that fails leaves the others')."""
    from services.devstack.kafka import create_topic
    from tests.support.mesh import running_mesh

    run_id = uuid.uuid4().hex[:6]
    socket_dir = Path(tempfile.mkdtemp(prefix="ds-pod-uds-"))  # a socket path ≤ 107 bytes
    topics = {size: f"bench-pod-{size}-{run_id}" for size in profile.sizes}
    groups = {
        size: {key: f"g-pod-{key}-{topics[size]}" for key in profile.run_paths}
        for size in profile.sizes
    }
    group_settings: dict[str, dict[str, str]] = {
        group: {"ordering": profile.ordering}
        for by_path in groups.values()
        for key, group in by_path.items()
        if twin_of(key) is not None
    }
    for by_path in groups.values():
        for key, group in by_path.items():
            if key in PATH_GROUP_SETTINGS:
                group_settings[group] = {
                    **group_settings.get(group, {}),
                    **PATH_GROUP_SETTINGS[key],
                }
    for topic in topics.values():
        create_topic(bootstrap, topic, PARTITIONS)
    results = []
    with running_mesh(bootstrap, log_dir) as mesh:
        notifier = mesh.service("notifier", "--log-format", "json")
        notifier.wait_serving()
        # A state topic and transactional id of the run's own: on a shared Kafka another
        # assigner on the defaults fences this one (static leadership stops for good).
        assigner = mesh.assigner(
            [(g, [topics[s]]) for s in profile.sizes for g in groups[s].values()],
            *sidecar_args(notifier),
            group_settings=group_settings,
            env={
                "DS_STATE_TOPIC": f"__ds_assigner_state-pod-{run_id}",
                "DS_STATE_TRANSACTIONAL_ID": f"ds-assigner-state-pod-{run_id}",
            },
        )
        assigner.wait_serving()
        for size in profile.sizes:
            res = run_size(
                mesh, assigner, notifier, bootstrap, size, profile, socket_dir,
                groups[size], topics[size], log_dir,
            )  # fmt: skip
            print_size(res, profile.run_paths, profile.direct_paths)
            results.append(res)
            done(results)
    return results


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None or value != value else round(value, digits)  # NaN: None


def flat_rows(detail: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """:func:`as_json`'s figures as the rows of docs/benchmarks/results (one flat row per
    process idle, and per size, rate and path; ``x_dc``: the path's CPU over the direct
    consumer's that commits per batch, in the same round; median, and ``_best``)."""
    idle: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    for size in detail["sizes"]:
        for name, procs in size["idle"].items():
            for proc, usage in procs.items():
                if proc == "load":
                    continue
                idle.append({
                    "size": size["size"], "process": name,
                    "cores_pct": _r(usage["cores"] * 100, 2),
                    "wakeups_per_s": _r(usage["wakeups"]),
                    "rss_mib": _r(usage["rss"] / 2**20), "load": _r(procs["load"][0]),
                })  # fmt: skip
        for rate in size["rates"]:
            produced = rate.get("produced_per_s") or []
            for key, p in rate["paths"].items():
                side = p.get("sidecar")
                over = rate.get("over_unordered", {}).get(key)
                rates.append({
                    "size": size["size"], "rate": rate["rate"], "path": key,
                    "produced_per_s": _r(statistics.median(produced)) if produced else None,
                    "load": _r(statistics.median(x[0] for x in rate["load_averages"])),
                    "app_mcores": _r(p["app"]["cores"][0] * 1000),
                    "sidecar_mcores": _r(side["cores"][0] * 1000) if side else None,
                    "total_mcores": _r(p["total_cores"][0] * 1000),
                    "total_mcores_best": _r(p["total_cores"][1] * 1000),
                    "x_dc": _r(p["ratio"][0], 2), "x_dc_best": _r(p["ratio"][1], 2),
                    "wakeups_app": _r(p["app"]["wakeups_per_s"][0]),
                    "wakeups_sidecar": _r(side["wakeups_per_s"][0]) if side else None,
                    "rss_app_mib": _r(p["app"]["rss_mib"]),
                    "rss_sidecar_mib": _r(side["rss_mib"]) if side else None,
                    "p50_ms": _r(p["p50_ms"][0]) if "p50_ms" in p else None,
                    "p99_ms": _r(p["p99_ms"][0]) if "p99_ms" in p else None,
                    **({"x_unordered": _r(over[0], 2), "x_unordered_best": _r(over[1], 2)}
                       if over else {}),
                })  # fmt: skip
    return {"idle": idle, "rates": rates}


SUMMARY = (
    "CPU, wake-ups, RSS and latency of a sidecar and its application (DsClient) beside "
    "direct confluent-kafka consumers (commit per batch: dc; auto-commit: da) and, with --share, "
    "a Kafka share-group consumer (Java KafkaShareConsumer: ds) reading the same records in the "
    "same window; median of the rounds (and best)."
)


def write_json(
    path: Path | None, label: str, profile: Profile, started: str, results: list[Size]
) -> None:
    """``path``'s folder gets ``<stem>.json`` in the convention of tests/support/bench_results:
    this run's tables under ``label``, beside the file's runs of other labels."""
    if path is None:
        return
    from tests.support.bench_results import write_result

    rows = flat_rows(as_json(results, profile, started))
    written = write_result(
        path.stem,
        title="A pod's cost at the rates services run (bench_pod_cost)",
        summary=SUMMARY,
        load={**asdict(profile), "started": started},
        results={"idle, no client": rows["idle"], "by rate": rows["rates"]},
        out_dir=path.parent,
        label=label,
        when=started,
    )
    print(f"\nwrote {written}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile (a minute or two)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument("--rates", help="records/s, comma-separated (0: attached, no traffic)")
    parser.add_argument("--sizes", help="record sizes in bytes, comma-separated")
    parser.add_argument("--paths", help=f"mesh paths, of {','.join(MESH_PATHS)}")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--window", type=float, help="seconds per round")
    parser.add_argument(
        "--idle-window",
        type=float,
        help="seconds of the idle window (default 10: CPU in steps of 0.1 %% of a core; "
        "60 resolves the idle targets of 0.3 and 0.5 %%)",
    )
    parser.add_argument("--json", type=Path, help=f"write the figures here (e.g. {JSON_DEFAULT})")
    parser.add_argument(
        "--label",
        default="latest",
        help="--json: the run's label; a run of the same label in the file is replaced, "
        "the others are kept",
    )
    parser.add_argument(
        "--ordering",
        choices=sorted(ORDERED_SUFFIX),
        help="also run every mesh path with its group in this ordering",
    )
    parser.add_argument("--keys", type=int, help="keyed records over N keys (--ordering: 100)")
    parser.add_argument(
        "--share",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also a share-group consumer, (ds) (default: in the full profile, not --short)",
    )
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also (dr): a bare Python relay and its reader, the floor of any Python sidecar "
        "(default: in the full profile, not --short)",
    )
    parser.add_argument(
        "--threads",
        action="store_true",
        help="print each mesh path's sidecar and application per thread (wake-ups/s, "
        "%% of a core) in the first round of each rate",
    )
    args = parser.parse_args()
    profile = SHORT if args.short else FULL
    if args.threads:
        profile = replace(profile, threads=True)
    if args.ordering:
        profile = replace(profile, ordering=args.ordering, keys=100)
    if args.keys is not None:
        if args.keys < 0:
            parser.error("--keys: 0 or more")
        profile = replace(profile, keys=args.keys)
    if args.rates:
        profile = replace(profile, rates=tuple(float(r) for r in args.rates.split(",")))
    if args.sizes:
        profile = replace(profile, sizes=tuple(int(s) for s in args.sizes.split(",")))
    if args.paths:
        paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
        if unknown := set(paths) - set(MESH_PATHS):
            parser.error(f"--paths: unknown {sorted(unknown)}; of {','.join(MESH_PATHS)}")
        profile = replace(profile, paths=paths)
    if args.rounds:
        profile = replace(profile, rounds=args.rounds)
    if args.share is not None:
        profile = replace(profile, share=args.share)
    if args.floor is not None:
        profile = replace(profile, floor=args.floor)
    if args.window:
        profile = replace(profile, window=args.window)
    if args.idle_window:
        profile = replace(profile, idle_window=args.idle_window)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    print(f"{started} load average {os.getloadavg()}; {profile}", flush=True)
    from tests.support.bench_kafka import bench_kafka

    with (
        bench_kafka(args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-pod-") as tmp,
    ):
        run(
            kafka.bootstrap,
            profile,
            Path(tmp),
            functools.partial(write_json, args.json, args.label, profile, started),
        )
    print(f"\ntotal {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
