"""Benchmark: consumer sidecar throughput and latency against a direct Kafka consumer.

    .venv/bin/python tests/bench/bench_sidecar.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap), produces N records of 100 B and
of 1 KiB, and measures, in the same run (CONVENTIONS "Tests": a baseline and the ratio,
never an asserted time):

(a) baseline: a confluent-kafka ``assign()`` + batch ``consume()`` loop over the same data
    (batches of 10,000), reading every record's key, value and offset, with the librdkafka
    fetch settings the sidecar uses (so the ratio is the cost of the hop through the
    sidecar), committing nothing; (a0) the same loop with librdkafka's defaults, for
    reference; (a1) (a) with a synchronous commit after each batch: the same at-least-once
    guarantee as (b)'s ``ack``, whose answer waits for its commit;
(b) through a sidecar with ``Fetch`` (``DsClient.fetch``: batches of up to 10,000 records,
    what the application gets — DsRecords with key, value and offset read by the loop, as
    in (a) — and one ``ack(batch)`` per batch, committed before it returns);
(b2) as (b) with ``ack_nowait(batch)``: the ack travels (and is committed) while the next
    batch is fetched; every ack's answer is checked before the rate is taken;
(c) through ``StreamService.Stream`` (``DsClient.stream(use_stream_rpc=True)``: credit
    window of 20,000 records, the same reads and one ack per batch on the stream, waited
    for); (c2) the same with ``ack_nowait(batch)``, every answer checked at the end;
(d) produce-to-client latency p50/p99 at 1,000 records/s, sidecar vs a direct consumer;
(e) (b) with librdkafka statistics on (default 5000 ms) and off
    (``DS_STATISTICS_INTERVAL_MS=0``): the overhead ratio;
(b2u), (cu) (b2) and (c) with the client in the sidecar's "pod": the sidecar also serves
    on a Unix domain socket (``DS_UDS_DIR``), the binding names it and the client dials it
    (the sidecar's ``ds_client_transport_requests_total`` must show every call came over
    it); printed beside their TCP rows, best and median of the rounds.

``--rows a,b2,b2u,c,cu`` measures only those rows ((a) always runs: it is the baseline);
``--rounds N`` sets the number of interleaved rounds, ``--sizes 1024`` runs one size.

With each best rate, the CPU seconds per million records that each process spent over the
same window (``/proc/PID/stat``): the application (this process), the sidecar and the
broker (when this script started it). Unlike wall-clock rates they hardly move with the
machine's load, and they show what bounds the ratios on a small machine: the sidecar path
runs three busy processes where the direct loop runs two.

Every rate runs from the first batch the application receives to the last (steady state:
start-up is not timed on either side); only one consumer or sidecar runs at a time. A
shared machine makes single runs noisy, so (a), (b) and (c) are measured ROUNDS times,
interleaved, and the best rate of each is kept (as ``timeit`` keeps the best time), for
the baseline as for the sidecar. Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.client import DsClient
from services.consumer_sidecar.kafka_config import SIDECAR_CONSUMER_DEFAULTS
from services.devstack.kafka import (
    KafkaCluster,
    KafkaOptions,
    create_topic,
    delete_topic,
)
from services.records.batches import DsRecord
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.ops import metric_samples
from tests.support.sidecar_probe import produce_bulk, start_sidecar

PARTITIONS = 8
FETCH_MAX = 10_000
FETCH_MAX_BYTES = 32 * 1024 * 1024  # never the limit: batches of FETCH_MAX records, as in (a)
STREAM_CREDIT = 20_000


@dataclass(frozen=True)
class Profile:
    records_100: int
    records_1k: int
    latency_seconds: float
    rounds: int


# Short still runs each rate for a second or more: shorter runs mostly measured start-up.
SHORT = Profile(records_100=600_000, records_1k=200_000, latency_seconds=8.0, rounds=3)
FULL = Profile(records_100=1_000_000, records_1k=300_000, latency_seconds=30.0, rounds=3)


@dataclass(frozen=True)
class Rate:
    records: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # process → CPU s over the window

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.per_second:>10,.0f} rec/s ({self.records} in {self.seconds:.2f}s)"

    def cpu_line(self) -> str:
        """CPU seconds per million records by process, their sum, and the cores it kept
        busy over the window."""
        if not self.cpu or not self.records:
            return ""
        per = 1e6 / self.records
        parts = " + ".join(f"{name} {used * per:.2f}" for name, used in self.cpu.items())
        total = sum(self.cpu.values())
        return (
            f"CPU s per 1M records: {parts} = {total * per:.2f}; "
            f"{total / self.seconds:.2f} of {os.cpu_count()} cores busy"
        )


# ---- CPU per process -----------------------------------------------------------------------

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far (Linux)."""
    # The command name in parentheses may hold spaces: the fields follow its last ')'.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND


class CpuWindow:
    """CPU seconds each named process used between :meth:`start` and :meth:`used`; a
    process without a pid (a broker this script did not start) is left out."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid is not None}
        self._started: dict[str, float] = {}

    def start(self) -> None:
        self._started = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def used(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) - self._started[name] for name, pid in self.pids.items()}


# ---- what the application does with each record, on both sides ---------------------------


def read_messages(messages: list[Message]) -> int:
    """(a): every record's key, value and offset read; the records counted."""
    count = 0
    for m in messages:
        if m.error() is None:
            m.key()
            m.value()
            m.offset()
            count += 1
    return count


def read_records(records: list[DsRecord]) -> int:
    """(b), (c): the same reads on what DsClient hands the application."""
    for r in records:
        r.key  # noqa: B018 - the read is the point
        r.value  # noqa: B018
        r.offset  # noqa: B018
    return len(records)


# ---- (a) direct consumer ------------------------------------------------------------------


def direct_consume(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    sidecar_settings: bool = True,
    commit: bool = False,
    broker_pid: int | None = None,
) -> Rate:
    started = time.monotonic()
    cpu = CpuWindow({"app": os.getpid(), "broker": broker_pid})
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-direct-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
    }
    if sidecar_settings:
        config.update(SIDECAR_CONSUMER_DEFAULTS)
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = 0
        first: float | None = None  # steady state: from the first record to the last
        deadline = started + 300
        while got < n and time.monotonic() < deadline:
            batch = read_messages(consumer.consume(FETCH_MAX, 1.0))
            if batch and commit:
                consumer.commit(asynchronous=False)  # the positions after this batch
            if batch and first is None:
                first = time.monotonic()  # the first batch starts the clock, uncounted
                cpu.start()
                n -= batch
                continue
            got += batch
        return Rate(got, time.monotonic() - (first or started), cpu.used() if first else {})
    finally:
        consumer.close()


# ---- (b)/(e) Fetch, (c) Stream through a sidecar ---------------------------------------


def serving_sidecar(
    mesh: Mesh, assigner: ServiceProcess, group: str, env: dict[str, str] | None = None
) -> tuple[ServiceProcess, float]:
    sidecar = start_sidecar(mesh, group, assigner, f"bench-{group[-12:]}", env=env)
    sidecar.wait_serving()
    return sidecar, time.monotonic()


def uds_env(socket_dir: Path | None) -> dict[str, str]:
    """The sidecar's environment: its socket in ``socket_dir`` (None: TCP only)."""
    return {} if socket_dir is None else {"DS_UDS_DIR": str(socket_dir)}


def check_transport(sidecar: ServiceProcess, client_id: str, uds: bool) -> None:
    """Every call of the client came over the transport the row names (the sidecar's
    count by transport), so a (b2u)/(cu) rate is never a TCP rate by mistake."""
    calls = {
        s.labels["transport"]: s.value
        for s in metric_samples(sidecar, "ds_client_transport_requests_total")
        if s.labels["client_id"] == client_id
    }
    wanted, other = ("unix", "tcp") if uds else ("tcp", "unix")
    if not calls:  # the sidecar did not answer /metrics: say so, keep the rate
        print(f"   {client_id}: transport not confirmed (no /metrics answer)", flush=True)
    elif not calls.get(wanted) or calls.get(other):
        raise RuntimeError(f"{client_id}: calls by transport {calls}, expected {wanted} only")


def check_acks(pending: list[tuple[Future[int], int]]) -> None:
    """Every ack_nowait answer accepted its whole batch."""
    for future, read in pending:
        if future.result(timeout=60) != read:
            raise RuntimeError("a batch was not acked whole")


def fetch_through(  # type: ignore[no-untyped-def]
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    n: int,
    env=None,
    *,
    nowait: bool = False,
    broker_pid: int | None = None,
    socket_dir: Path | None = None,
) -> Rate:
    """(b) ``fetch`` + ``ack`` per batch; with ``nowait``, (b2) ``fetch`` + ``ack_nowait``:
    the ack of one batch travels while the next is fetched, and every ack's answer is
    checked (all records accepted) before the rate is taken. With ``socket_dir``, over
    the sidecar's Unix domain socket there."""
    sidecar, started = serving_sidecar(
        mesh, assigner, group, {**(env or {}), **uds_env(socket_dir)}
    )
    cpu = CpuWindow({"app": os.getpid(), "sidecar": sidecar.pid, "broker": broker_pid})
    got = 0
    pending: list[tuple[Future[int], int]] = []
    try:
        with DsClient(group, client_id="bench-fetch", assigner=assigner.grpc_addr) as client:
            deadline = started + 300
            first: float | None = None  # steady state: from the first record to the last
            while got < n and time.monotonic() < deadline:
                batch = client.fetch(FETCH_MAX, max_wait=1.0, max_bytes=FETCH_MAX_BYTES)
                if batch:
                    read = read_records(batch)
                    if nowait:
                        pending.append((client.ack_nowait(batch), read))
                    elif client.ack(batch) != read:
                        raise RuntimeError("a batch was not acked whole")
                    if first is None:
                        first = time.monotonic()  # the first batch starts the clock, uncounted
                        cpu.start()
                        n -= read
                        continue
                    got += read
            check_acks(pending)
            took = time.monotonic() - (first or started)
            used = cpu.used() if first else {}
        check_transport(sidecar, "bench-fetch", uds=socket_dir is not None)
        return Rate(got, took, used)
    finally:
        sidecar.stop()


def stream_through(
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    n: int,
    *,
    nowait: bool = False,
    broker_pid: int | None = None,
    socket_dir: Path | None = None,
) -> Rate:
    """(c) ``stream`` + ``ack`` per batch; with ``nowait``, (c2) ``ack_nowait``, every
    answer checked (all records accepted) before the rate is taken. With ``socket_dir``,
    over the sidecar's Unix domain socket there."""
    sidecar, started = serving_sidecar(mesh, assigner, group, uds_env(socket_dir))
    cpu = CpuWindow({"app": os.getpid(), "sidecar": sidecar.pid, "broker": broker_pid})
    got = 0
    first: float | None = None  # steady state: the first batch starts the clock, uncounted
    pending: list[tuple[Future[int], int]] = []
    try:
        with DsClient(group, client_id="bench-stream", assigner=assigner.grpc_addr) as client:
            deadline = started + 300
            for batch in client.stream(STREAM_CREDIT, use_stream_rpc=True):
                read = read_records(batch)
                if nowait:
                    pending.append((client.ack_nowait(batch), read))
                elif client.ack(batch) != read:
                    raise RuntimeError("a batch was not acked whole")
                if first is None:
                    first = time.monotonic()
                    cpu.start()
                    n -= read
                else:
                    got += read
                if got >= n or time.monotonic() > deadline:
                    check_acks(pending)  # still on the stream: leaving the loop closes it
                    break
            took = time.monotonic() - (first or started)
            used = cpu.used() if first else {}
        check_transport(sidecar, "bench-stream", uds=socket_dir is not None)
        return Rate(got, took, used)
    finally:
        sidecar.stop()


# ---- (d) latency -------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_run(
    mesh: Mesh, assigner: ServiceProcess, bootstrap: str, topic: str, group: str, seconds: float
) -> tuple[list[float], list[float]]:
    """Produce 1,000 records/s stamped with time.time_ns(); (sidecar, direct) latencies ms."""
    sidecar, _ = serving_sidecar(mesh, assigner, group)
    ours: list[float] = []
    direct: list[float] = []
    stop = threading.Event()
    warm = threading.Event()

    def stamp_ms(value: bytes) -> float:
        return (time.time_ns() - int(value.split(b":", 1)[0])) / 1e6

    def direct_loop() -> None:
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"bench-lat-{uuid.uuid4().hex[:8]}"}
        )
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
            while not stop.is_set():
                for m in consumer.consume(1000, 0.1):
                    if m.error() is None and warm.is_set():
                        direct.append(stamp_ms(m.value() or b"0:"))
        finally:
            consumer.close()

    def produce_loop() -> None:
        producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 1}
        )
        started = time.monotonic()
        sent = 0
        pad = b"x" * 80
        while not stop.is_set():
            due = int((time.monotonic() - started) * 1000)
            while sent < due:
                producer.produce(
                    topic, value=b"%d:" % time.time_ns() + pad, partition=sent % PARTITIONS
                )
                sent += 1
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(10)

    try:
        with DsClient(group, client_id="bench-latency", assigner=assigner.grpc_addr) as client:
            threads = [threading.Thread(target=f, daemon=True) for f in (direct_loop, produce_loop)]
            for t in threads:
                t.start()
            end = time.monotonic() + seconds
            warm_at = time.monotonic() + 2.0  # leases granted, fetch and group set up
            while time.monotonic() < end:
                batch = client.fetch(max_records=1000, max_wait=0.2)
                now_warm = time.monotonic() >= warm_at
                if now_warm:
                    warm.set()
                    ours.extend(stamp_ms(r.value) for r in batch)
                if batch:
                    client.ack(batch)
            stop.set()
            for t in threads:
                t.join(timeout=15)
    finally:
        stop.set()
        sidecar.stop()
    return ours, direct


# ---- main --------------------------------------------------------------------------------


def ratio(a: Rate | str, b: Rate) -> str:
    if isinstance(a, str) or b.per_second == 0:
        return "n/a"
    return f"{a.per_second / b.per_second:.2f}"


def best(rates: list[Rate]) -> Rate:
    return max(rates, key=lambda r: r.per_second)


def median_rate(rates: list[Rate]) -> float:
    return statistics.median(r.per_second for r in rates) if rates else 0.0


def best_and_median(rows: dict[str, list[Rate]], key: str, base: list[Rate]) -> str:
    """A row's best rate and its ratio to the best baseline, and the median of its rounds
    and its ratio to the baseline's median."""
    ours = rows[key]
    top, mid, base_mid = best(ours), median_rate(ours), median_rate(base)
    return (
        f"best {top.per_second:>10,.0f} rec/s ratio {ratio(top, best(base))}; median "
        f"{mid:>10,.0f} rec/s ratio {mid / base_mid if base_mid else float('nan'):.2f}"
    )


# Rows --rows may name; (a) always runs.
ROWS = ("a", "a1", "b", "b2", "b2u", "c", "c2", "cu")
# The socket rows beside the TCP rows they repeat.
UDS_PAIRS = (("b2", "b2u", "Fetch + ack_nowait"), ("c", "cu", "Stream + ack"))


def run(
    bootstrap: str,
    profile: Profile,
    log_dir: Path,
    broker_pid: int | None = None,
    rows: frozenset[str] = frozenset(ROWS),
    only_sizes: frozenset[int] = frozenset(),
) -> None:
    run_id = uuid.uuid4().hex[:6]
    # A short directory: a socket path has at most 107 bytes.
    socket_dir = Path(tempfile.mkdtemp(prefix="ds-bench-uds-"))
    sizes = {100: profile.records_100, 1024: profile.records_1k}
    sizes = {k: v for k, v in sizes.items() if not only_sizes or k in only_sizes}
    topics = {size: f"bench-sidecar-{size}-{run_id}" for size in sizes}
    lat_topic = f"bench-sidecar-lat-{run_id}"
    modes = [
        f"{m}{i}"
        for m in ("fetch", "fetchnw", "fetchnwu", "stream", "streamnw", "streamu")
        for i in range(profile.rounds)
    ]
    groups = [(f"g-{m}-{topics[s]}", [topics[s]]) for s in sizes for m in [*modes, "nostats"]]
    groups.append((f"g-{lat_topic}", [lat_topic]))
    for topic in [*topics.values(), lat_topic]:
        create_topic(bootstrap, topic, PARTITIONS)
    print(
        "Each side reads every record's key, value and offset. (a) confluent-kafka consume() "
        f"batches of {FETCH_MAX}, no commits, the sidecar's librdkafka fetch settings "
        f"{SIDECAR_CONSUMER_DEFAULTS}; (a0) the same with librdkafka defaults; (a1) (a) with "
        f"a synchronous commit per batch; (b) DsClient.fetch batches of up to {FETCH_MAX} + "
        f"ack(batch), committed before it returns; (b2) the same with ack_nowait(batch); (c) "
        f"DsClient.stream over the Stream RPC, credit {STREAM_CREDIT}, ack(batch) on the "
        f"stream; (c2) the same with ack_nowait(batch). Rates from the first batch on; best "
        f"of {profile.rounds} interleaved rounds each."
    )
    try:
        with running_mesh(bootstrap, log_dir) as mesh:
            assigner = mesh.assigner(groups)
            assigner.wait_serving()
            for size, n in sizes.items():
                topic = topics[size]
                took = produce_bulk(bootstrap, topic, n, size, PARTITIONS)
                print(f"\n== {n} records x {size} B (produced in {took:.1f}s)", flush=True)
                rates: dict[str, list[Rate]] = {k: [] for k in ROWS}
                pid = broker_pid
                for i in range(profile.rounds):
                    rates["a"].append(direct_consume(bootstrap, topic, n, broker_pid=pid))
                    if "a1" in rows:
                        rates["a1"].append(
                            direct_consume(bootstrap, topic, n, commit=True, broker_pid=pid)
                        )
                    for key, group, nowait, uds in (
                        ("b", "fetch", False, False),
                        ("b2", "fetchnw", True, False),
                        ("b2u", "fetchnwu", True, True),
                    ):
                        if key in rows:
                            rates[key].append(
                                fetch_through(
                                    mesh,
                                    assigner,
                                    f"g-{group}{i}-{topic}",
                                    n,
                                    nowait=nowait,
                                    broker_pid=pid,
                                    socket_dir=socket_dir if uds else None,
                                )
                            )
                    for key, group, nowait, uds in (
                        ("c", "stream", False, False),
                        ("c2", "streamnw", True, False),
                        ("cu", "streamu", False, True),
                    ):
                        if key in rows:
                            rates[key].append(
                                stream_through(
                                    mesh,
                                    assigner,
                                    f"g-{group}{i}-{topic}",
                                    n,
                                    nowait=nowait,
                                    broker_pid=pid,
                                    socket_dir=socket_dir if uds else None,
                                )
                            )
                    print(
                        f"   round {i + 1}: "
                        + "  ".join(f"({k}) {v[-1].per_second:,.0f}" for k, v in rates.items() if v)
                        + " rec/s",
                        flush=True,
                    )
                if not rows >= {"a1", "b", "b2", "c", "c2"}:
                    print_selected(rates)
                    continue
                base, committing = best(rates["a"]), best(rates["a1"])
                fetch, nowait = best(rates["b"]), best(rates["b2"])
                stream, stream_nowait = best(rates["c"]), best(rates["c2"])
                default = direct_consume(bootstrap, topic, n, sidecar_settings=False)
                print(f"(a)  direct consume() baseline     {base}")
                print(f"(a0) direct, librdkafka defaults   {default}")
                print(f"(a1) direct + commit per batch     {committing}")
                print(
                    f"(b)  sidecar Fetch + ack           {fetch}  ratio {ratio(fetch, base)}"
                    f" (to a1: {ratio(fetch, committing)})"
                )
                print(f"(b2) sidecar Fetch + ack_nowait    {nowait}  ratio {ratio(nowait, base)}")
                print(
                    f"(c)  sidecar Stream + ack          {stream}  ratio {ratio(stream, base)}"
                    f" (to a1: {ratio(stream, committing)})"
                )
                print(
                    f"(c2) sidecar Stream + ack_nowait   {stream_nowait}  ratio "
                    f"{ratio(stream_nowait, base)}"
                )
                print("     with each best rate above, over the same window:")
                for key in ("a", "a1", "b", "b2", "c", "c2"):
                    print(f"     ({key}) {best(rates[key]).cpu_line()}")
                print_uds(rates)
                env = {"DS_STATISTICS_INTERVAL_MS": "0"}
                nostats = fetch_through(mesh, assigner, f"g-nostats-{topic}", n, env)
                print(
                    f"(e)  sidecar Fetch (stats off)     {nostats}  ratio {ratio(nostats, base)}; "
                    f"stats-on (best of {profile.rounds}) / stats-off (one run) "
                    f"{ratio(fetch, nostats)}",
                    flush=True,
                )
            if rows != frozenset(ROWS):
                return  # --rows: the throughput rows only
            ours, direct = latency_run(
                mesh, assigner, bootstrap, lat_topic, f"g-{lat_topic}", profile.latency_seconds
            )
            print(f"\n== latency at 1,000 records/s for {profile.latency_seconds:.0f}s (ms)")
            for name, values in (("direct consumer", direct), ("sidecar Fetch", ours)):
                print(
                    f"(d) {name:16} n={len(values):6}  p50 {percentile(values, 0.5):7.1f}  "
                    f"p99 {percentile(values, 0.99):7.1f}  mean "
                    f"{statistics.fmean(values) if values else float('nan'):7.1f}"
                )
            if ours and direct:
                print(
                    f"(d) ratio sidecar/direct: p50 "
                    f"{percentile(ours, 0.5) / max(percentile(direct, 0.5), 1e-9):.2f}, p99 "
                    f"{percentile(ours, 0.99) / max(percentile(direct, 0.99), 1e-9):.2f}"
                )
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
        for topic in [*topics.values(), lat_topic]:
            try:
                delete_topic(bootstrap, topic)
            except Exception as exc:  # a bench must still print what it measured
                print(f"could not delete {topic}: {exc}", file=sys.stderr)


def print_uds(rates: dict[str, list[Rate]]) -> None:
    """The socket rows beside the TCP rows they repeat: best and median of the rounds,
    each as a ratio to the direct loop's, and socket/TCP."""
    for tcp, uds, what in UDS_PAIRS:
        if not rates[tcp] or not rates[uds]:
            continue
        print(f"({tcp:3}) {what:20} TCP   {best_and_median(rates, tcp, rates['a'])}")
        print(f"({uds:3}) {what:20} UDS   {best_and_median(rates, uds, rates['a'])}")
        mid_tcp, mid_uds = median_rate(rates[tcp]), median_rate(rates[uds])
        print(
            f"      UDS/TCP: best {ratio(best(rates[uds]), best(rates[tcp]))}, median "
            f"{mid_uds / mid_tcp if mid_tcp else float('nan'):.2f}"
        )
        print(f"      ({tcp}) {best(rates[tcp]).cpu_line()}")
        print(f"      ({uds}) {best(rates[uds]).cpu_line()}")


def print_selected(rates: dict[str, list[Rate]]) -> None:
    """What --rows measured: the baseline, each row's best and median, the socket rows."""
    print(f"(a)   direct consume() baseline  best {best(rates['a'])}, median "
          f"{median_rate(rates['a']):,.0f} rec/s")  # fmt: skip
    print(f"      (a) {best(rates['a']).cpu_line()}")
    for key, values in rates.items():
        if values and key != "a" and key not in {k for pair in UDS_PAIRS for k in pair[:2]}:
            print(f"({key:3}) {best_and_median(rates, key, rates['a'])}")
    print_uds(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile (~20-40 s of work)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"the rows to measure, of {','.join(ROWS)} ((a) always; default all)",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: the profile's)")
    parser.add_argument(
        "--sizes", default="", help="record sizes to run, of 100,1024 (default both)"
    )
    args = parser.parse_args()
    rows = frozenset(r.strip() for r in args.rows.split(",") if r.strip()) | {"a"}
    if unknown := rows - set(ROWS):
        parser.error(f"--rows: unknown {sorted(unknown)}; rows are {','.join(ROWS)}")
    profile = SHORT if args.short else FULL
    if args.rounds:
        profile = replace(profile, rounds=args.rounds)
    started = time.monotonic()
    cluster: KafkaCluster | None = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        cluster = KafkaCluster(KafkaOptions(brokers=1)).start()
        bootstrap = cluster.bootstrap
        print(f"kafka started in {time.monotonic() - started:.1f}s at {bootstrap}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
            pid = cluster.pids[0] if cluster is not None else None
            sizes = frozenset(int(size) for size in args.sizes.split(",") if size.strip())
            run(bootstrap, profile, Path(tmp), pid, rows, sizes)
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
