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
(d) produce-to-application latency at 1,000 records/s (``--rows d`` alone): one producer
    process stamps each record's value with its seq and ``time.time_ns()``; at the same
    time, each in a process of its own, on the same records: a direct consumer with
    librdkafka's defaults (d0, the baseline) and with the sidecar's fetch settings (ds),
    both ``assign()`` + ``poll()`` per record, and a DsClient loop through a sidecar of its
    own: ``fetch`` over TCP (dF) and over the sidecar's Unix domain socket (dFu), and
    ``stream`` over the Stream RPC (dS), each batch acked with ``ack_nowait`` (``--lat-paths``
    adds dFa/dSa, acked with ``ack``, and d0c, the earlier direct loop ``consume(1000, 0.1)``).
    The records produced after every path received records and a warm-up are cut into
    ROUNDS windows; per path and window: p50, p99, p99.9, max, n, and the window's records
    it missed or received more than once, and p50/p99 of its latency less (d0)'s on the
    same record (what the path adds); p99 best and median of the rounds and its ratio to
    (d0)'s in the same round; per process, its CPU and its threads' wait for a CPU.
    ``--lat-rate`` sets the rate (below 1 record/s a sidecar idles between records);
(e) (b) with librdkafka statistics on (default 5000 ms) and off
    (``DS_STATISTICS_INTERVAL_MS=0``): the overhead ratio;
(b2u), (cu) (b2) and (c) with the client in the sidecar's "pod": the sidecar also serves
    on a Unix domain socket (``DS_UDS_DIR``), the binding names it and the client dials it
    (the sidecar's ``ds_client_transport_requests_total`` must show every call came over
    it); printed beside their TCP rows, best and median of the rounds;
(cc), (ccu) (c) with ``DsClient.stream_columns`` (Arrow columns, ``ColumnBatch``), same
    credit, one ``ack(batch)`` per batch: (cc) over TCP (``DELIVERY_FORMAT_BATCHES`` turned
    into Arrow by the client: one copy), (ccu) over the sidecar's socket
    (``DELIVERY_FORMAT_ARROW_SHM``: written once into shared memory by the sidecar, read in
    place; every stream must have used that format). The application reads each batch as
    ``bench_shm_transport.py``'s client does: its row count and the sum of its value
    lengths (``pyarrow.compute``), no per-record Python.

(b2k), (c2k) (b2) and (c2) with the group's ``ordering: key`` (issue 39; the records are
    keyed by sequence number, so one client is never held back: what the key gate costs
    the path), interleaved with (b2) and (c2) in each round and printed as a ratio to them
    (best and median); not in the default rows (``--rows a,b2,b2k,c2,c2k``).

``--rows a,b2,b2u,c,cu,cc,ccu`` measures only those rows ((a) always runs with a throughput row: it
is the baseline; ``--rows d`` runs the latency row alone);
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
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow.compute as pc

from dataservice.sidecar.v1 import stream_pb2
from dsclient import Batch, ColumnBatch, DsClient
from dsclient.records.batches import DsRecord
from services.consumer_sidecar.kafka_config import SIDECAR_CONSUMER_DEFAULTS
from services.devstack.kafka import (
    create_topic,
    delete_topic,
)
from tests.support.bench_kafka import bench_kafka
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
# 600,000 at 1 KiB: with 300,000 the direct loop ran for half a second (28 Nov, 542k/s).
FULL = Profile(records_100=1_000_000, records_1k=600_000, latency_seconds=30.0, rounds=3)


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


def run_queue_seconds(pid: int) -> float:
    """Seconds the threads of a process have spent runnable but waiting for a CPU so far
    (``/proc/PID/task/*/schedstat``, second field; threads that ended are not counted)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total / 1e9


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


def read_records(records: Sequence[DsRecord]) -> int:
    """(b), (c): the same reads on what DsClient hands the application."""
    for r in records:
        r.key  # noqa: B018 - the read is the point
        r.value  # noqa: B018
        r.offset  # noqa: B018
    return len(records)


def read_columns(batch: ColumnBatch) -> int:
    """(cc), (ccu): the rows and the sum of the value lengths, on the columns in place."""
    pc.sum(pc.binary_length(batch.table.column("value"))).as_py()
    return len(batch)


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
    # Unique: two sidecars of one run may share a socket directory (the latency paths).
    sidecar = start_sidecar(mesh, group, assigner, f"bench-{uuid.uuid4().hex[:10]}", env=env)
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


def columns_through(
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    n: int,
    *,
    broker_pid: int | None = None,
    socket_dir: Path | None = None,
) -> Rate:
    """(cc) ``stream_columns`` + ``ack`` per batch over TCP; with ``socket_dir``, (ccu) over
    the sidecar's Unix domain socket there, in shared memory (checked: every stream of the
    client used ARROW_SHM)."""
    sidecar, started = serving_sidecar(mesh, assigner, group, uds_env(socket_dir))
    cpu = CpuWindow({"app": os.getpid(), "sidecar": sidecar.pid, "broker": broker_pid})
    got = 0
    first: float | None = None  # steady state: the first batch starts the clock, uncounted
    wanted = (
        stream_pb2.DELIVERY_FORMAT_BATCHES
        if socket_dir is None
        else stream_pb2.DELIVERY_FORMAT_ARROW_SHM
    )
    formats: set[int] = set()
    try:
        with DsClient(group, client_id="bench-columns", assigner=assigner.grpc_addr) as client:
            deadline = started + 300
            for batch in client.stream_columns(STREAM_CREDIT):
                read = read_columns(batch)
                if client.ack(batch) != read:
                    raise RuntimeError("a batch was not acked whole")
                if first is None:
                    first = time.monotonic()
                    cpu.start()
                    n -= read
                    formats |= {s.format for s in client._streams.values()}
                else:
                    got += read
                if got >= n or time.monotonic() > deadline:
                    formats |= {s.format for s in client._streams.values()}
                    break
            took = time.monotonic() - (first or started)
            used = cpu.used() if first else {}
        check_transport(sidecar, "bench-columns", uds=socket_dir is not None)
        if formats != {wanted}:
            raise RuntimeError(f"bench-columns: stream formats {formats}, expected {wanted}")
        return Rate(got, took, used)
    finally:
        sidecar.stop()


# ---- (d) latency -------------------------------------------------------------------------
#
# Every path runs in a process of its own (no path waits for another's GIL) at the same
# time, on the same records: one producer process stamps each value "seq:time_ns:" at
# produce(), each path's application loop takes time.time_ns() when it is handed the record
# (the same clock, CLOCK_REALTIME, in every process of the machine), keeps the first
# arrival of each seq and counts later ones as duplicates. The measured records are the
# seqs produced after every path has received records and a warm-up; they are cut into
# ROUNDS consecutive windows, and every path is scored on the same seqs of each window.

LAT_RATE = 1_000  # records/s
LAT_PAD = b"x" * 80
LAT_WARM_SECONDS = 3.0  # after every path received its first record
LAT_DRAIN_SECONDS = 3.0  # after the producer stopped: late records still count
LAT_FETCH_RECORDS = 1_000  # DsClient.fetch(max_records) and the Stream credit
LAT_FETCH_WAIT = 0.2
LAT_DIRECT_POLL = 1.0  # the direct loop's poll(timeout): returns on a record's arrival
LAT_PRODUCER = {"enable.idempotence": True, "linger.ms": 1}


@dataclass(frozen=True)
class LatPath:
    """One path measured in (d): ``kind`` direct | fetch | stream | columns
    (``stream_columns``: over the socket, ``DELIVERY_FORMAT_ARROW_SHM``)."""

    key: str
    label: str
    kind: str
    sidecar_settings: bool = False  # direct: the sidecar's librdkafka fetch settings
    uds: bool = False  # fetch/stream: the client dials the sidecar's Unix domain socket
    # fetch/stream: "ack_nowait" (the next read does not wait for this batch's commit) or
    # "ack" (waits for it)
    ack: str = "ack_nowait"
    batch: bool = False  # direct: consume(1000, 0.1) instead of poll() per record


LAT_PATHS = (
    LatPath("d0", "direct, librdkafka defaults", "direct"),
    LatPath("ds", "direct, sidecar fetch settings", "direct", sidecar_settings=True),
    LatPath("dF", "DsClient.fetch TCP", "fetch"),
    LatPath("dFu", "DsClient.fetch UDS", "fetch", uds=True),
    LatPath("dS", "DsClient.stream (Stream RPC) TCP", "stream"),
)
# More paths --lat-paths may name: the client loops waiting for each ack's commit before
# the next read, and the direct loop of the earlier (d): consume(1000, 0.1), which returns
# when 1,000 records came or 0.1 s passed (librdkafka fills the batch or times out).
LAT_MORE = (
    LatPath("dFa", "DsClient.fetch TCP", "fetch", ack="ack"),
    LatPath("dSa", "DsClient.stream (Stream RPC) TCP", "stream", ack="ack"),
    LatPath("d0c", "direct, librdkafka defaults, consume(1000, 0.1)", "direct", batch=True),
    LatPath("dSc", "DsClient.stream_columns UDS (ARROW_SHM)", "columns", uds=True),
)
LAT_ALL = {p.key: p for p in (*LAT_PATHS, *LAT_MORE)}


@dataclass
class LatResult:
    """What one path's process saw: first-arrival latency (ms) by seq, duplicates by seq."""

    first_ms: dict[int, float] = field(default_factory=dict)
    duplicates: dict[int, int] = field(default_factory=dict)
    error: str = ""

    def see(self, value: bytes, now_ns: int) -> None:
        seq, stamp, _ = value.split(b":", 2)
        s = int(seq)
        if s in self.first_ms:
            self.duplicates[s] = self.duplicates.get(s, 0) + 1
        else:
            self.first_ms[s] = (now_ns - int(stamp)) / 1e6


def _lat_produce(
    bootstrap: str, topic: str, rate: float, stop: Any, sent: Any, failed: Any
) -> None:
    """The producer process: ``rate`` records/s round-robin over the partitions, each
    value stamped ``seq:time_ns:`` at produce(); ``sent`` counts them."""
    producer = Producer({"bootstrap.servers": bootstrap, **LAT_PRODUCER})

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            with failed.get_lock():
                failed.value += 1

    started = time.monotonic()
    seq = 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while seq < due:
            value = b"%d:%d:" % (seq, time.time_ns()) + LAT_PAD
            producer.produce(topic, value=value, partition=seq % PARTITIONS, on_delivery=delivered)
            seq += 1
            sent.value = seq
        producer.poll(0)
        time.sleep(0.0005)
    producer.flush(10)


def _lat_direct(path: LatPath, bootstrap: str, topic: str, ready: Any, first: Any,
                stop: Any, out: Any) -> None:  # fmt: skip
    """A direct consumer process: assign() from the end, the canonical poll() loop."""
    result = LatResult()
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-lat-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
    }
    if path.sidecar_settings:
        config.update(SIDECAR_CONSUMER_DEFAULTS)
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
        ready.set()
        while not stop.is_set():
            if path.batch:
                messages = consumer.consume(1000, 0.1)
            else:
                m = consumer.poll(LAT_DIRECT_POLL)
                messages = [] if m is None else [m]
            now = time.time_ns()
            for m in messages:
                if m.error() is None:
                    result.see(m.value() or b"0:0:", now)
                    first.set()
    except Exception as exc:  # reported by the parent
        result.error = repr(exc)
    finally:
        consumer.close()
        out.put((path.key, result))


def _lat_client(path: LatPath, group: str, assigner: str, ready: Any, first: Any,
                stop: Any, out: Any) -> None:  # fmt: skip
    """A DsClient process: fetch() long-polls, or stream() over the Stream RPC; each batch
    stamped on arrival, then acked as ``path.ack`` says."""
    result = LatResult()
    pending: list[tuple[Future[int], int]] = []
    client_id = f"bench-lat-{path.key}"
    try:
        with DsClient(group, client_id=client_id, assigner=assigner) as client:

            def handle(batch: Batch | ColumnBatch) -> None:
                now = time.time_ns()
                if isinstance(batch, ColumnBatch):
                    for value in batch.table.column("value").to_pylist():
                        result.see(value, now)
                else:
                    for r in batch:
                        assert r.value is not None, "_lat_produce writes a value in every record"
                        result.see(r.value, now)
                if path.ack == "ack_nowait":
                    pending.append((client.ack_nowait(batch), len(batch)))
                elif client.ack(batch) != len(batch):
                    raise RuntimeError("a batch was not acked whole")
                first.set()

            ready.set()
            if path.kind == "fetch":
                while not stop.is_set():
                    batch = client.fetch(max_records=LAT_FETCH_RECORDS, max_wait=LAT_FETCH_WAIT)
                    if batch:
                        handle(batch)
            else:

                def close_on_stop() -> None:
                    stop.wait()
                    client.close()

                closer = threading.Thread(target=close_on_stop)
                closer.start()
                batches: Iterator[Batch] | Iterator[ColumnBatch] = (
                    client.stream_columns(LAT_FETCH_RECORDS)
                    if path.kind == "columns"
                    else client.stream(LAT_FETCH_RECORDS, use_stream_rpc=True)
                )
                for streamed in batches:
                    handle(streamed)
                    if stop.is_set():
                        break
                closer.join()
            check_acks(pending)
    except Exception as exc:  # reported by the parent
        result.error = repr(exc)
    finally:
        out.put((path.key, result))


@dataclass(frozen=True)
class LatStats:
    n: int
    missed: int
    duplicated: int
    p50: float
    p99: float
    p999: float
    max: float
    extra_p50: float  # this path's latency less (d0)'s on the same record, p50 and p99
    extra_p99: float

    def __str__(self) -> str:
        return (
            f"n={self.n:6} missed {self.missed:4} dup {self.duplicated:4}  p50 {self.p50:7.1f}"
            f"  p99 {self.p99:7.1f}  p99.9 {self.p999:7.1f}  max {self.max:7.1f}"
            f"  vs (d0) on the same record: p50 {self.extra_p50:+6.1f} p99 {self.extra_p99:+6.1f}"
        )


def lat_stats(result: LatResult, seqs: range, base: LatResult) -> LatStats:
    values = [result.first_ms[s] for s in seqs if s in result.first_ms]
    # The same record's latency on this path less the baseline's: what the path adds,
    # without the delays upstream of both consumers (producer, broker) that both share.
    extra = [
        result.first_ms[s] - base.first_ms[s]
        for s in seqs
        if s in result.first_ms and s in base.first_ms
    ]
    return LatStats(
        n=len(values),
        missed=len(seqs) - len(values),
        duplicated=sum(result.duplicates.get(s, 0) for s in seqs),
        p50=percentile(values, 0.5),
        p99=percentile(values, 0.99),
        p999=percentile(values, 0.999),
        max=max(values) if values else float("nan"),
        extra_p50=percentile(extra, 0.5),
        extra_p99=percentile(extra, 0.99),
    )


@dataclass(frozen=True)
class LatRun:
    """(d)'s outcome: each path's stats per round, the load average at the start and
    after each round, and per path and process (CPU share of a core, share of the time
    its threads waited for a CPU) over the rounds."""

    stats: dict[str, list[LatStats]]
    loads: list[tuple[float, ...]]
    usage: dict[str, dict[str, tuple[float, float]]]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_run(
    mesh: Mesh,
    assigner: ServiceProcess,
    bootstrap: str,
    topic: str,
    groups: dict[str, str],
    profile: Profile,
    socket_dir: Path,
    paths: tuple[LatPath, ...],
    rate: float = LAT_RATE,
) -> LatRun:
    """(d): every path of ``paths`` at once on the records of one producer at ``rate``;
    per path, the stats of each of ``profile.rounds`` windows of
    ``profile.latency_seconds``, and the load average during the run."""
    ctx = multiprocessing.get_context("spawn")
    stop, stop_producer = ctx.Event(), ctx.Event()
    out = ctx.Queue()
    sidecars: dict[str, ServiceProcess] = {}
    procs: list[Any] = []
    firsts: dict[str, Any] = {}
    loads: list[tuple[float, ...]] = [os.getloadavg()]
    pids: dict[str, dict[str, int]] = {}  # path → process name → pid
    try:
        for path in paths:
            ready, firsts[path.key] = ctx.Event(), ctx.Event()
            if path.kind == "direct":
                args: tuple[Any, ...] = (path, bootstrap, topic)
                target: Any = _lat_direct
            else:
                env = uds_env(socket_dir if path.uds else None)
                sidecars[path.key], _ = serving_sidecar(mesh, assigner, groups[path.key], env)
                args = (path, groups[path.key], assigner.grpc_addr)
                target = _lat_client
            proc = ctx.Process(
                target=target, args=(*args, ready, firsts[path.key], stop, out), daemon=True
            )
            proc.start()
            procs.append(proc)
            assert proc.pid is not None  # set by start()
            pids[path.key] = {"app": proc.pid}
            if path.key in sidecars:
                sidecar_pid = sidecars[path.key].pid
                assert sidecar_pid is not None  # started by serving_sidecar
                pids[path.key]["sidecar"] = sidecar_pid
            if not ready.wait(120):
                raise RuntimeError(f"({path.key}) did not start")
        sent, failed = ctx.Value("q", 0), ctx.Value("q", 0)
        producer = ctx.Process(
            target=_lat_produce,
            args=(bootstrap, topic, rate, stop_producer, sent, failed),
            daemon=True,
        )
        producer.start()
        for key, event in firsts.items():
            if not event.wait(120):
                raise RuntimeError(f"({key}) received no record in 120 s")
        time.sleep(LAT_WARM_SECONDS)
        start = sent.value
        cpu_at = {k: {n: (cpu_seconds(p), run_queue_seconds(p)) for n, p in v.items()}
                  for k, v in pids.items()}  # fmt: skip
        window_started = time.monotonic()
        per_round = int(profile.latency_seconds * rate)
        for _ in range(profile.rounds):
            time.sleep(profile.latency_seconds)
            loads.append(os.getloadavg())
        window = time.monotonic() - window_started
        usage = {
            key: {
                name: (
                    (cpu_seconds(pid) - cpu_at[key][name][0]) / window,
                    (run_queue_seconds(pid) - cpu_at[key][name][1]) / window,
                )
                for name, pid in names.items()
            }
            for key, names in pids.items()
        }
        stop_producer.set()
        producer.join(30)
        time.sleep(LAT_DRAIN_SECONDS)
        stop.set()
        results: dict[str, LatResult] = {}
        for _ in paths:
            key, result = out.get(timeout=120)
            if result.error:
                raise RuntimeError(f"({key}) failed: {result.error}")
            results[key] = result
        if failed.value:
            print(f"(d) the producer failed to deliver {failed.value} records", flush=True)
        for path in paths:
            if path.kind != "direct":
                check_transport(sidecars[path.key], f"bench-lat-{path.key}", uds=path.uds)
        windows = [
            range(start + i * per_round, start + (i + 1) * per_round) for i in range(profile.rounds)
        ]
        base = results[paths[0].key]  # (d0)
        stats = {key: [lat_stats(r, w, base) for w in windows] for key, r in results.items()}
        return LatRun(stats, loads, usage)
    finally:
        stop.set()
        stop_producer.set()
        for proc in procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
        for sidecar in sidecars.values():
            sidecar.stop()


def print_latency(
    run: LatRun, profile: Profile, paths: tuple[LatPath, ...], rate: float = LAT_RATE
) -> None:
    """Each path's stats per round, then its p99 (best and median of the rounds) and its
    ratio to the direct consumer's (librdkafka defaults) in the same round."""
    stats, loads = run.stats, run.loads
    print(
        f"\n== (d) produce-to-application latency (ms) at {rate:,} records/s of "
        f"{len(LAT_PAD) + 20} B, {PARTITIONS} partitions, {profile.rounds} rounds of "
        f"{profile.latency_seconds:.0f} s, every path at once on the same records, each in a "
        f"process of its own; load average {' '.join(f'{x:.1f}' for x in loads[0])} at the "
        f"start, {max(x[0] for x in loads):.1f} at most (1 min)"
    )
    print(
        f"    producer linger.ms {LAT_PRODUCER['linger.ms']}; direct: assign() + poll("
        f"{LAT_DIRECT_POLL}) per record, (d0) librdkafka defaults, (ds) the sidecar's "
        f"{dict(SIDECAR_CONSUMER_DEFAULTS)}; sidecars: those settings, "
        f"DsClient.fetch(max_records={LAT_FETCH_RECORDS}, max_wait={LAT_FETCH_WAIT}) or "
        f"stream({LAT_FETCH_RECORDS}, use_stream_rpc=True), each batch acked as the row says"
    )
    for path in paths:
        ack = "" if path.kind == "direct" else f" + {path.ack}"
        print(f"({path.key}) {path.label}{ack}")
        for i, s in enumerate(stats[path.key]):
            print(f"     round {i + 1}: {s}")
    base = stats["d0"]
    print("p99 (ms): best and median of the rounds; ratio to (d0)'s p99 in the same round")
    for path in paths:
        p99s = [s.p99 for s in stats[path.key]]
        ratios = [
            s.p99 / b.p99 if b.p99 else float("nan")
            for s, b in zip(stats[path.key], base, strict=True)
        ]
        missed = sum(s.missed for s in stats[path.key])
        dup = sum(s.duplicated for s in stats[path.key])
        print(
            f"({path.key:3}) p99 best {min(p99s):7.1f} median {statistics.median(p99s):7.1f}"
            f"  ratio best {min(ratios):.2f} median {statistics.median(ratios):.2f}"
            f"  (p50 median {statistics.median(s.p50 for s in stats[path.key]):6.1f};"
            f" missed {missed}, duplicated {dup})"
        )
    print("over the rounds, per process: CPU (share of a core) / waiting for a CPU (share of time)")
    for path in paths:
        use = run.usage.get(path.key, {})
        print(f"({path.key:3}) " + "  ".join(f"{n} {c:.2f} / {w:.2f}" for n, (c, w) in use.items()))


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
ROWS = ("a", "a1", "b", "b2", "b2u", "c", "c2", "cu", "cc", "ccu", "d", "b2k", "c2k")
DEFAULT_ROWS = ROWS[:-2]  # the key-ordered rows on request
# The groups of the key-ordered rows (their name's second part) and the rows they repeat.
KEYED = ("fetchnwk", "streamnwk")
ORDERING_PAIRS = (("b2", "b2k", "Fetch + ack_nowait"), ("c2", "c2k", "Stream + ack_nowait"))
# The socket rows beside the TCP rows they repeat.
UDS_PAIRS = (
    ("b2", "b2u", "Fetch + ack_nowait"),
    ("c", "cu", "Stream + ack"),
    ("cc", "ccu", "Stream columns + ack"),
)


def run(
    bootstrap: str,
    profile: Profile,
    log_dir: Path,
    broker_pid: int | None = None,
    rows: frozenset[str] = frozenset(ROWS),
    only_sizes: frozenset[int] = frozenset(),
    lat_paths: tuple[LatPath, ...] = LAT_PATHS,
    lat_rate: float = LAT_RATE,
) -> None:
    run_id = uuid.uuid4().hex[:6]
    # A short directory: a socket path has at most 107 bytes.
    socket_dir = Path(tempfile.mkdtemp(prefix="ds-bench-uds-"))
    sizes = {100: profile.records_100, 1024: profile.records_1k}
    sizes = {k: v for k, v in sizes.items() if not only_sizes or k in only_sizes}
    if not rows - {"d"}:
        sizes = {}  # --rows d: the latency row alone
    topics = {size: f"bench-sidecar-{size}-{run_id}" for size in sizes}
    lat_topic = f"bench-sidecar-lat-{run_id}"
    modes = [
        f"{m}{i}"
        for m in (
            "fetch",
            "fetchnw",
            "fetchnwu",
            "fetchnwk",
            "stream",
            "streamnw",
            "streamnwk",
            "streamu",
            "columns",
            "columnsu",
        )
        for i in range(profile.rounds)
    ]
    groups = [(f"g-{m}-{topics[s]}", [topics[s]]) for s in sizes for m in [*modes, "nostats"]]
    lat_groups = {p.key: f"g-{p.key}-{lat_topic}" for p in lat_paths if p.kind != "direct"}
    groups += [(group, [lat_topic]) for group in lat_groups.values()]
    for topic in [*topics.values(), lat_topic]:
        create_topic(bootstrap, topic, PARTITIONS)
    print(
        ""
        if not sizes
        else "Each side reads every record's key, value and offset. (a) confluent-kafka consume() "
        f"batches of {FETCH_MAX}, no commits, the sidecar's librdkafka fetch settings "
        f"{SIDECAR_CONSUMER_DEFAULTS}; (a0) the same with librdkafka defaults; (a1) (a) with "
        f"a synchronous commit per batch; (b) DsClient.fetch batches of up to {FETCH_MAX} + "
        f"ack(batch), committed before it returns; (b2) the same with ack_nowait(batch); (c) "
        f"DsClient.stream over the Stream RPC, credit {STREAM_CREDIT}, ack(batch) on the "
        f"stream; (c2) the same with ack_nowait(batch); (cc)/(ccu) DsClient.stream_columns "
        f"(Arrow), the same credit and ack(batch), reading rows and the sum of value lengths "
        f"(pyarrow.compute), over TCP (BATCHES -> Arrow) / the socket (ARROW_SHM). Rates "
        f"from the first batch on; best "
        f"of {profile.rounds} interleaved rounds each."
    )
    try:
        with running_mesh(bootstrap, log_dir) as mesh:
            ordered = {
                g: {"ordering": "key"}
                for g, _ in groups
                if g.split("-")[1].rstrip("0123456789") in KEYED
            }
            assigner = mesh.assigner(groups, group_settings=ordered)
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
                        ("b2k", "fetchnwk", True, False),
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
                        ("c2k", "streamnwk", True, False),
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
                    for key, group, uds in (("cc", "columns", False), ("ccu", "columnsu", True)):
                        if key in rows:
                            rates[key].append(
                                columns_through(
                                    mesh,
                                    assigner,
                                    f"g-{group}{i}-{topic}",
                                    n,
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
                fetch, fetch_nowait = best(rates["b"]), best(rates["b2"])
                stream, stream_nowait = best(rates["c"]), best(rates["c2"])
                default = direct_consume(bootstrap, topic, n, sidecar_settings=False)
                print(f"(a)  direct consume() baseline     {base}")
                print(f"(a0) direct, librdkafka defaults   {default}")
                print(f"(a1) direct + commit per batch     {committing}")
                print(
                    f"(b)  sidecar Fetch + ack           {fetch}  ratio {ratio(fetch, base)}"
                    f" (to a1: {ratio(fetch, committing)})"
                )
                print(
                    f"(b2) sidecar Fetch + ack_nowait    {fetch_nowait}"
                    f"  ratio {ratio(fetch_nowait, base)}"
                )
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
                print_ordering(rates)
                env = {"DS_STATISTICS_INTERVAL_MS": "0"}
                nostats = fetch_through(mesh, assigner, f"g-nostats-{topic}", n, env)
                print(
                    f"(e)  sidecar Fetch (stats off)     {nostats}  ratio {ratio(nostats, base)}; "
                    f"stats-on (best of {profile.rounds}) / stats-off (one run) "
                    f"{ratio(fetch, nostats)}",
                    flush=True,
                )
            if "d" in rows:
                lat = latency_run(
                    mesh,
                    assigner,
                    bootstrap,
                    lat_topic,
                    lat_groups,
                    profile,
                    socket_dir,
                    lat_paths,
                    lat_rate,
                )
                print_latency(lat, profile, lat_paths, lat_rate)
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
    # A socket row and its TCP row are printed together by print_uds when both ran.
    paired = {k for tcp, uds, _ in UDS_PAIRS if rates[tcp] and rates[uds] for k in (tcp, uds)}
    for key, values in rates.items():
        if values and key != "a" and key not in paired:
            print(f"({key:3}) {best_and_median(rates, key, rates['a'])}")
    print_uds(rates)
    print_ordering(rates)


def print_ordering(rates: dict[str, list[Rate]]) -> None:
    """The key-ordered rows over their unordered twins, measured in the same rounds."""
    for plain, keyed, what in ORDERING_PAIRS:
        if not rates[plain] or not rates[keyed]:
            continue
        mid_plain, mid_keyed = median_rate(rates[plain]), median_rate(rates[keyed])
        print(
            f"({keyed:3}) {what} ordering key over unordered ({plain}): best "
            f"{ratio(best(rates[keyed]), best(rates[plain]))}, median "
            f"{mid_keyed / mid_plain if mid_plain else float('nan'):.2f}"
        )
        print(f"      ({plain}) {best(rates[plain]).cpu_line()}")
        print(f"      ({keyed}) {best(rates[keyed]).cpu_line()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile (~20-40 s of work)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument(
        "--rows",
        default=",".join(DEFAULT_ROWS),
        help=f"the rows to measure, of {','.join(ROWS)} ((a) with any but d; default all)",
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: the profile's)")
    parser.add_argument(
        "--sizes", default="", help="record sizes to run, of 100,1024 (default both)"
    )
    parser.add_argument(
        "--lat-paths",
        default=",".join(p.key for p in LAT_PATHS),
        help=f"(d)'s paths, of {','.join(LAT_ALL)} (d0, the baseline, always)",
    )
    parser.add_argument(
        "--lat-rate",
        type=float,
        default=LAT_RATE,
        help=f"(d)'s records/s (default {LAT_RATE}; below 1 a sidecar idles between records)",
    )
    args = parser.parse_args()
    keys = ["d0", *(k.strip() for k in args.lat_paths.split(",") if k.strip() not in ("", "d0"))]
    if unknown_paths := set(keys) - set(LAT_ALL):
        parser.error(f"--lat-paths: unknown {sorted(unknown_paths)}; of {','.join(LAT_ALL)}")
    lat_paths = tuple(LAT_ALL[k] for k in keys)
    rows = frozenset(r.strip() for r in args.rows.split(",") if r.strip())
    rows |= set() if rows == {"d"} else {"a"}  # (a): the throughput rows' baseline
    if unknown := rows - set(ROWS):
        parser.error(f"--rows: unknown {sorted(unknown)}; rows are {','.join(ROWS)}")
    profile = SHORT if args.short else FULL
    if args.rounds:
        profile = replace(profile, rounds=args.rounds)
    started = time.monotonic()
    with (
        bench_kafka(args.bootstrap, announce=True) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp,
    ):
        pid = kafka.cluster.pids[0] if kafka.cluster is not None else None
        sizes = frozenset(int(size) for size in args.sizes.split(",") if size.strip())
        run(kafka.bootstrap, profile, Path(tmp), pid, rows, sizes, lat_paths, args.lat_rate)
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
