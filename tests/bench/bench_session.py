"""How many sidecars one assigner core holds, and how fast it re-places a failed one's partitions.

    python tests/bench/bench_session.py [--sidecars 1000 2000 5000 --partitions 2000]
    python tests/bench/bench_session.py --interval 0     # closed loop: heartbeats as fast as acked
    python tests/bench/bench_session.py --short      # CI profile: 20 sidecars, 100 partitions, 3 s
    python tests/bench/bench_session.py --bootstrap 127.0.0.1:9092   # reuse a running Kafka
    python tests/bench/bench_session.py --sidecars 1000 --no-floor --profile build/profile
    python tests/bench/bench_session.py --saturate [--max-sidecars 10000]
    python tests/bench/bench_session.py --saturate --connections per-sidecar
    python tests/bench/bench_session.py --short --load python   # the sidecars in Python processes

Starts a real Kafka (1 KRaft broker from deploy/kafka, unless ``--bootstrap``), a topic with
``--partitions`` partitions (default max(2,000, the largest size)), and a real ``ds-assigner``
process with one group per size. The simulated sidecars run in one Go process (``--load
go``, the default when a Go toolchain is found: clients/go/cmd/sessionload, built into
build/ with ``go build`` first; it answers the same commands as the Python workers, one JSON
value a line on its stdin/stdout) or in ``--workers`` Python client processes (``--load
python``: each owns a slice of them, on its own event loop and connections). The Go load
costs a fraction of the assigner's CPU per heartbeat, the Python one about as much as the
assigner: the clients' CPU is printed beside the assigner's. ``--connections``: the HTTP/2
connections the sidecars share (48), or ``per-sidecar`` (one each, as real sidecars in their
own pods; the open-files soft limit is raised to the hard one). Each sidecar opens a
``Session`` stream, joins, and heartbeats every ``--interval`` seconds (1 s: the default
heartbeat interval; 0: a closed loop, the next heartbeat as soon as the previous one is
acked), naming the leases it holds and releasing what it was revoked, as
``services/consumer_sidecar`` does: a grant is held from when it arrives, live from the
first ack that renews it, and each renewal gives it deadline = that heartbeat's send time +
TTL - safety margin. A lease whose deadline passed is no longer held, and one the assigner
stopped renewing is dropped (``leasing.py``).

After a warm-up (every partition held, no grant or revoke for 1 s), acked heartbeats are
counted for ``--seconds`` with ack latency p50/p99 and the assigner process's own CPU
(``/proc/<pid>/stat`` via psutil: the client processes do not count against it). Then one
sidecar is killed (its stream cut, no Leave, as a ``kill -9``) and the time until every
one of its partitions is live on another sidecar is the re-place time (TTL + grace by
design: the assigner waits out a lost holder's lease before granting it elsewhere).

Baseline, same run, same workers, same pacing: gRPC health ``Check`` calls (a trivial unary
call), one per simulated sidecar per interval. Printed: both, and the ratio of the
assigner's CPU per heartbeat to its CPU per health check.

The floor, same run, same workers, pacing and messages: the ``Session`` stream with no
assigner behind it (:class:`EchoServicer`: a join is granted its share of the partitions
at once, each heartbeat acked renewing what it names), in its own process, on a bare
``grpc.aio`` server, on one built as the assigner's is (``create_server``: error mapping,
health, reflection, the leader guard), and that one on uvloop when uvloop is installed
(``--no-floor`` skips them). What gRPC's stream costs per heartbeat, beside what the
assigner costs. ``--profile DIR`` records the assigner with py-spy (``--native``, installed
separately) over each heartbeat window, in speedscope format: py-spy stops the process
for each sample, so a profiled run's rates are not the unprofiled ones. "sidecars/core" is acked
heartbeats per assigner CPU-second times the interval: the sidecars one fully busy
assigner core would keep at that interval.

``--saturate`` raises the sidecars 1,000, 2,000, 3,000, 5,000, 7,000, 10,000 (then +5,000)
up to ``--max-sidecars``, each size with its own topic (``--partitions``, default
max(2,000, sidecars): every sidecar can hold one) and its own assigner process, without the
baseline and floor rows, until one assigner core no longer keeps up (:func:`saturated`: its
CPU at 95 % of a core, fewer than 97 % of the offered heartbeats acked, or the p99 ack later
than the 0.5 s lease safety margin), and prints the last size held and the first not, each
with its kill -9 re-place time. Nothing is asserted about time (ARCHITECTURE §9).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import os
import queue
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from confluent_kafka.admin import AdminClient, NewPartitions
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc, types_pb2
from dsclient.connection.policy import pause_before_retry
from dsclient.reasons import retry_after
from services.assigner.leader_guard import LeaderGuard
from services.assigner.leadership import StaticLeadership
from services.consumer_sidecar.session import RECONNECT_BACKOFF
from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic, delete_topic
from services.devstack.ports import free_ports
from services.runtime.grpcserver import SERVER_OPTIONS, GrpcService, create_server
from services.runtime.settings import ServiceSettings
from tests.support.mesh import ServiceProcess

TTL = 3.0  # the assigner's default lease TTL (the bench starts it with its defaults)
GRACE = 1.0
SAFETY_MARGIN = 0.5  # the sidecar's default lease_safety_margin_seconds
TP = tuple[str, int]
ACK_GRACE = 3.0  # how long after a window its heartbeats' acks are waited for


@dataclass
class Lease:
    epoch: int
    deadline: float  # local: nothing is held past it
    confirmed: bool = False  # renewed by an ack at least once (live)


@dataclass
class SimSidecar:
    """One simulated sidecar: a Session stream, its leases as a real sidecar keeps them."""

    sid: str
    group: str
    leases: dict[TP, Lease] = field(default_factory=dict)
    released: list[assigner_pb2.ReleasedLease] = field(default_factory=list)
    seq: int = 0
    sent: dict[int, tuple[float, frozenset[tuple[TP, int]]]] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lease_changes: int = 0
    joined: bool = False
    killed: bool = False
    rejoins: int = 0
    call: Any = None

    def join(self, now: float) -> assigner_pb2.SessionRequest:
        return assigner_pb2.SessionRequest(
            join=assigner_pb2.SessionJoin(
                sidecar_id=self.sid,
                group=self.group,
                endpoint=f"127.0.0.1:1/{self.sid}",
                held_leases=[
                    types_pb2.LeaseRef(topic=t, partition=p, epoch=lease.epoch)
                    for (t, p), lease in self.leases.items()
                    if now < lease.deadline
                ],
            )
        )

    def held(self, now: float) -> list[TP]:
        """Live leases: confirmed and within their local deadline."""
        return [tp for tp, lease in self.leases.items() if lease.confirmed and now < lease.deadline]

    def heartbeat(self, now: float) -> assigner_pb2.SessionRequest:
        self.seq += 1
        released, self.released = self.released, []
        for tp in [tp for tp, lease in self.leases.items() if now >= lease.deadline]:
            del self.leases[tp]  # lapsed locally: the sidecar stops and drops it
            self.lease_changes += 1
        named = frozenset((tp, lease.epoch) for tp, lease in self.leases.items())
        self.sent[self.seq] = (now, named)
        return assigner_pb2.SessionRequest(
            heartbeat=assigner_pb2.SessionHeartbeat(
                seq=self.seq,
                leases=[
                    assigner_pb2.LeaseProgress(
                        topic=t, partition=p, epoch=e, position=100, committed_offset=100
                    )
                    for (t, p), e in named
                ],
                released_leases=released,
            )
        )

    def on_ack(self, ack: assigner_pb2.HeartbeatAck, now: float) -> float | None:
        """Renew what the ack renews, drop what it named but did not; the send time."""
        entry = self.sent.pop(ack.seq, None)
        for old in [s for s in self.sent if s < ack.seq]:
            del self.sent[old]
        if entry is None:
            return None
        sent_at, named = entry
        renewed = {((r.topic, r.partition), r.epoch) for r in ack.renewed_leases}
        for tp, epoch in renewed:
            lease = self.leases.get(tp)
            if lease is not None and lease.epoch == epoch:
                lease.deadline = sent_at + TTL - SAFETY_MARGIN
                lease.confirmed = True
        for tp, epoch in named - renewed:
            lease = self.leases.get(tp)
            if lease is not None and lease.epoch == epoch:
                del self.leases[tp]  # the assigner no longer counts it ours
                self.lease_changes += 1
        return sent_at


@dataclass
class Window:
    start: float = float("inf")
    end: float = 0.0
    acks: int = 0
    latencies: list[float] = field(default_factory=list)

    def record(self, sent: float, now: float) -> None:
        """An ack of a heartbeat sent within the window (counted when it arrives within
        ACK_GRACE after the window: later ones are missing from the rate)."""
        if self.start <= sent < self.end and now <= self.end + ACK_GRACE:
            self.acks += 1
            self.latencies.append(now - sent)


@dataclass
class Worker:
    """The state one client process shares between its sidecars' tasks."""

    interval: float
    window: Window = field(default_factory=Window)
    errors: dict[str, int] = field(default_factory=dict)  # failed calls by status code
    # Re-place watch: partitions of the failed sidecar -> when first live elsewhere.
    watching: set[TP] = field(default_factory=set)
    live_at: dict[TP, float] = field(default_factory=dict)

    def check_watch(self, sim: SimSidecar, now: float) -> None:
        for tp in self.watching & sim.leases.keys():
            if sim.leases[tp].confirmed and tp not in self.live_at:
                self.live_at[tp] = now


async def drive(
    sim: SimSidecar, stub: assigner_pb2_grpc.AssignerServiceAsyncStub, w: Worker, delay: float = 0.0
) -> None:
    """Session after Session (the first after ``delay``: the ramp): a broken stream (the
    assigner dropped a member it found lost) is re-attached with the leases still held, and
    a refused join (JOIN_THROTTLED) retried, after the pause the sidecar's session loop
    takes (``pause_before_retry``: its jittered backoff, at least the retry-after plus up
    to half of it again)."""
    await asyncio.sleep(delay)
    retries = 0
    while not sim.killed:
        asked = None
        try:
            await session(sim, stub, w)
            retries = 0
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.CANCELLED and sim.killed:
                return
            w.errors[err.code().name] = w.errors.get(err.code().name, 0) + 1
            asked = retry_after(err)
        sim.joined = False
        sim.rejoins += 1
        await asyncio.sleep(pause_before_retry(RECONNECT_BACKOFF, retries, random.random(), asked))
        retries += 1


async def session(
    sim: SimSidecar, stub: assigner_pb2_grpc.AssignerServiceAsyncStub, w: Worker
) -> None:
    outbox: asyncio.Queue[assigner_pb2.SessionRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[assigner_pb2.SessionRequest]:
        while (request := await outbox.get()) is not None:
            yield request

    async def pace() -> None:
        # Spread the sidecars' heartbeats over the interval, as independent sidecars are.
        await asyncio.sleep(random.uniform(0, w.interval))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sim.wake.wait(), w.interval)
            sim.wake.clear()
            outbox.put_nowait(sim.heartbeat(time.monotonic()))

    sim.seq, sim.sent = 0, {}
    outbox.put_nowait(sim.join(time.monotonic()))
    sim.call = call = stub.Session(requests())
    pacer: asyncio.Task[None] | None = None
    try:
        async for response in call:
            kind = response.WhichOneof("kind")
            now = time.monotonic()
            if kind == "accepted":
                sim.joined = True
                if w.interval > 0:
                    pacer = asyncio.create_task(pace())
                else:
                    outbox.put_nowait(sim.heartbeat(now))
            elif kind == "grant":
                g = response.grant
                # Held from now; live from the first ack renewing it (sent at once).
                sim.leases[(g.topic, g.partition)] = Lease(g.epoch, now + TTL - SAFETY_MARGIN)
                sim.lease_changes += 1
                sim.wake.set()
            elif kind == "revoke":
                r = response.revoke
                lease = sim.leases.pop((r.topic, r.partition), None)
                sim.released.append(
                    assigner_pb2.ReleasedLease(
                        topic=r.topic,
                        partition=r.partition,
                        epoch=lease.epoch if lease else r.epoch,
                        committed_offset=100,
                    )
                )
                sim.lease_changes += 1
                sim.wake.set()
            elif kind == "heartbeat_ack":
                sent = sim.on_ack(response.heartbeat_ack, now)
                if sent is not None:
                    w.window.record(sent, now)
                    if w.watching:
                        w.check_watch(sim, now)
                    if w.interval <= 0 and response.heartbeat_ack.seq == sim.seq:
                        outbox.put_nowait(sim.heartbeat(now))
    finally:
        if pacer is not None:
            pacer.cancel()
        outbox.put_nowait(None)


async def health_loop(stub: health_pb2_grpc.HealthStub, w: Worker, until: float) -> None:
    request = health_pb2.HealthCheckRequest()
    await asyncio.sleep(random.uniform(0, max(w.interval, 0.001)))
    while (sent := time.monotonic()) < until:
        try:
            await stub.Check(request, timeout=30)
        except grpc.aio.AioRpcError as err:
            w.errors[err.code().name] = w.errors.get(err.code().name, 0) + 1
            continue
        w.window.record(sent, time.monotonic())
        if w.interval > 0:
            await asyncio.sleep(max(0.0, sent + w.interval - time.monotonic()))


class EchoServicer(assigner_pb2_grpc.AssignerServiceServicer):
    """The floor: a ``Session`` with no assigner behind it. A join is accepted and granted
    its share of the partitions at once (epoch 1, partition p to sidecar p mod n), and each
    heartbeat is acked renewing every lease it names: the assigner's messages, none of its
    work (no lease table, no tick, no state writes, no metrics, no logging)."""

    def __init__(self, topic: str, partitions: int, sidecars: int) -> None:
        self.topic, self.partitions, self.sidecars = topic, partitions, sidecars

    async def Session(
        self, request_iterator: AsyncIterator[assigner_pb2.SessionRequest], context: Any
    ) -> AsyncIterator[assigner_pb2.SessionResponse]:
        first = await anext(request_iterator)
        yield assigner_pb2.SessionResponse(
            accepted=assigner_pb2.SessionAccepted(
                session_id=first.join.sidecar_id,
                lease_ttl=duration_pb2.Duration(seconds=int(TTL)),
                heartbeat_interval=duration_pb2.Duration(seconds=1),
            )
        )
        index = int(first.join.sidecar_id.rsplit("-", 1)[1])
        for p in range(index % self.sidecars, self.partitions, self.sidecars):
            yield assigner_pb2.SessionResponse(
                grant=assigner_pb2.LeaseGrant(topic=self.topic, partition=p, epoch=1)
            )
        async for request in request_iterator:
            if request.WhichOneof("kind") != "heartbeat":
                continue
            hb = request.heartbeat
            yield assigner_pb2.SessionResponse(
                heartbeat_ack=assigner_pb2.HeartbeatAck(
                    seq=hb.seq,
                    renewed_leases=[
                        types_pb2.LeaseRef(topic=x.topic, partition=x.partition, epoch=x.epoch)
                        for x in hb.leases
                    ],
                )
            )

    async def Leave(
        self, request: assigner_pb2.LeaveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> assigner_pb2.LeaveResponse:
        """Not part of the floor (the simulated sidecars never leave): UNIMPLEMENTED, as the
        generated servicer answers."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo keeps no membership")


async def echo_main(
    conn: multiprocessing.connection.Connection,
    topic: str,
    partitions: int,
    sidecars: int,
    setup: str,
) -> None:
    """Serve the echo: on a bare ``grpc.aio.server`` ("bare"), or built as the assigner's
    server is ("assigner": ``create_server`` with its error mapping, health and reflection,
    and the assigner's leader guard, leading)."""
    servicer = EchoServicer(topic, partitions, sidecars)
    if setup == "bare":
        server = grpc.aio.server(options=SERVER_OPTIONS)
        assigner_pb2_grpc.add_AssignerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        guard = LeaderGuard(StaticLeadership("127.0.0.1:0"))
        built = create_server(
            ServiceSettings(host="127.0.0.1", grpc_port=0, http_port=0),
            [
                GrpcService(
                    assigner_pb2.DESCRIPTOR.services_by_name["AssignerService"].full_name,
                    servicer,
                    assigner_pb2_grpc.add_AssignerServiceServicer_to_server,
                )
            ],
            interceptors=[guard],
        )
        server, port = built.server, built.port
    await server.start()
    conn.send(port)
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop
    await server.stop(0)


def echo_entry(
    conn: multiprocessing.connection.Connection,
    topic: str,
    partitions: int,
    sidecars: int,
    setup: str,
) -> None:
    """``setup`` is "bare" or "ours", with "+uvloop": on uvloop's event loop."""
    server, _, loop = setup.partition("+")
    factory = None
    if loop == "uvloop":
        import uvloop  # only for this row; not a dependency of the services

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(echo_main(conn, topic, partitions, sidecars, server))


def channels(addr: str, n: int) -> list[grpc.aio.Channel]:
    # Several HTTP/2 connections per process, as many real sidecars would open one each.
    return [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(n)
    ]


async def worker_main(
    conn: multiprocessing.connection.Connection,
    addr: str,
    group: str,
    ids: list[str],
    interval: float,
    connections: int,
) -> None:
    """One client process: runs its slice of sidecars and answers the parent's commands."""
    w = Worker(interval)
    chans = channels(addr, connections)
    loop = asyncio.get_running_loop()

    async def command() -> tuple[Any, ...]:
        return tuple(await loop.run_in_executor(None, conn.recv))

    await asyncio.gather(*(c.channel_ready() for c in chans))
    conn.send("ready")
    # Baseline first (when asked): health checks at the same pacing, in the parent's window.
    cmd = await command()
    if cmd[0] == "baseline":
        w.window = Window(cmd[1], cmd[2])
        health = [health_pb2_grpc.HealthStub(c) for c in chans]
        await asyncio.gather(
            *(health_loop(health[i % len(health)], w, cmd[2]) for i in range(len(ids)))
        )
        conn.send(("baseline", w.window.acks, w.window.latencies, w.errors))
        w.window, w.errors = Window(), {}
        cmd = await command()
    assert cmd[0] == "sessions"
    ramp = float(cmd[1]) if len(cmd) > 1 else 0.0
    conn.send(None)

    stubs = [assigner_pb2_grpc.AssignerServiceStub(c) for c in chans]
    sims = {sid: SimSidecar(sid, group) for sid in ids}
    tasks = [
        asyncio.create_task(drive(s, stubs[i % len(stubs)], w, random.uniform(0, ramp)))
        for i, s in enumerate(sims.values())
    ]
    while True:
        cmd = await command()
        now = time.monotonic()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        if cmd[0] == "status":
            held = sum(len(s.held(now)) for s in sims.values())
            changes = sum(s.lease_changes for s in sims.values())
            joined = sum(s.joined for s in sims.values())
            conn.send((held, changes, joined, sum(s.rejoins for s in sims.values())))
        elif cmd[0] == "window":
            w.window = Window(cmd[1], cmd[2])
            conn.send(None)
        elif cmd[0] == "results":
            conn.send((w.window.acks, w.window.latencies, w.errors))
        elif cmd[0] == "kill":
            sim = max(sims.values(), key=lambda s: len(s.held(now)))
            killed_held = sim.held(now)
            sim.killed = True
            sim.call.cancel()  # the stream breaks; no Leave: the assigner finds it lost
            conn.send(killed_held)
        elif cmd[0] == "watch":
            w.watching, w.live_at = set(cmd[1]), {}
            conn.send(None)
        elif cmd[0] == "live":
            conn.send(dict(w.live_at))
        elif cmd[0] == "stop":
            break
    for t in tasks:
        t.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await asyncio.gather(*tasks, return_exceptions=True)
    for c in chans:
        await c.close(None)  # grace None: the stubs omit grpc's default
    conn.send(None)


def worker_entry(
    conn: multiprocessing.connection.Connection,
    addr: str,
    group: str,
    ids: list[str],
    interval: float,
    connections: int,
) -> None:
    asyncio.run(worker_main(conn, addr, group, ids, interval, connections))


class Workers:
    """The client processes of one measurement, each owning a slice of the sidecars."""

    def __init__(
        self, addr: str, group: str, n: int, processes: int, interval: float, connections: int
    ) -> None:
        self.interval = interval
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may run grpc
        ids = [f"sim-{i:05d}" for i in range(n)]
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        processes = max(1, min(processes, n))
        for k in range(processes):
            mine = ids[k::processes]
            parent, child = ctx.Pipe()
            per = max(1, min(connections // processes, len(mine)))
            proc = ctx.Process(
                target=worker_entry, args=(child, addr, group, mine, interval, per), daemon=True
            )
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            self._recv(pipe, 120.0)  # started, connected

    def ask(self, *cmd: Any, timeout: float = 120.0) -> list[Any]:
        for p in self.pipes:
            p.send(cmd)
        return [self._recv(p, timeout) for p in self.pipes]

    def ask_one(self, k: int, *cmd: Any, timeout: float = 120.0) -> Any:
        self.pipes[k].send(cmd)
        return self._recv(self.pipes[k], timeout)

    def _recv(self, pipe: multiprocessing.connection.Connection, timeout: float) -> Any:
        if not pipe.poll(timeout):
            dead = [p.exitcode for p in self.procs if not p.is_alive()]
            raise RuntimeError(f"a client process did not answer in {timeout}s (exited: {dead})")
        return pipe.recv()

    def send_all(self, *cmd: Any) -> None:
        for p in self.pipes:
            p.send(cmd)

    def collect(self, timeout: float) -> list[Any]:
        """The answers to what :meth:`send_all` sent."""
        return [self._recv(p, timeout) for p in self.pipes]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(psutil.Process(p.pid)) for p in self.procs if p.pid is not None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask("stop", timeout=30)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


class Load(Protocol):
    """The simulated sidecars of one measurement: :class:`Workers` (Python client processes)
    or :class:`GoLoad` (one Go process), answering the same commands."""

    interval: float

    def ask(self, *cmd: Any, timeout: float = 120.0) -> list[Any]: ...
    def ask_one(self, k: int, *cmd: Any, timeout: float = 120.0) -> Any: ...
    def send_all(self, *cmd: Any) -> None: ...
    def collect(self, timeout: float) -> list[Any]: ...
    def cpu_seconds(self) -> float: ...
    def close(self) -> None: ...


REPO = Path(__file__).resolve().parents[2]
GO_BINARY = REPO / "build" / "sessionload"


def go_toolchain() -> str | None:
    """The Go toolchain: $GO, then ``go`` on PATH, then /usr/local/go/bin/go (make setup's)."""
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def build_go_load(go: str) -> Path:
    """``go build`` clients/go/cmd/sessionload into build/ (Go's caches as the Makefile's
    GO_ENV puts them: incremental, about a second when nothing changed)."""
    home = Path.home()
    env = os.environ | {
        "GOMODCACHE": str(home / ".cache" / "go-mod"),
        "GOCACHE": str(home / ".cache" / "go-build"),
        "GOFLAGS": "-mod=readonly",
    }
    GO_BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [go, "build", "-o", str(GO_BINARY), "./cmd/sessionload"],
        cwd=REPO / "clients" / "go",
        env=env,
        check=True,
    )
    return GO_BINARY


def encode_command(cmd: tuple[Any, ...]) -> str:
    """One command as the Go load reads it: a JSON array on one line."""
    return json.dumps(list(cmd), separators=(",", ":")) + "\n"


def decode_answer(name: str, line: str) -> Any:
    """The Go load's answer to command ``name`` in the shape a Python worker sends it."""
    value = json.loads(line)
    if name == "kill":
        return [(t, int(p)) for t, p in value]
    if name == "live":
        return {(t, int(p)): float(at) for t, p, at in value}
    return value


class GoLoad:
    """All the sidecars in one Go process (clients/go/cmd/sessionload) over stdin/stdout,
    one JSON value a line. ``connections`` 0: one HTTP/2 connection per sidecar."""

    def __init__(
        self, binary: Path, addr: str, group: str, n: int, interval: float, connections: int
    ) -> None:
        self.interval = interval
        conns = "per-sidecar" if connections == 0 else str(connections)
        argv = ["--addr", addr, "--group", group, "--sidecars", str(n)]
        argv += ["--interval", str(interval), "--connections", conns]
        self.proc = subprocess.Popen(
            [str(binary), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.sent: list[str] = []  # names of the commands not answered yet, oldest first
        threading.Thread(target=self._read, daemon=True).start()
        if self._recv_line(180.0) != '"ready"':
            raise RuntimeError("the Go load did not start")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _recv_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the Go load did not answer in {timeout}s") from None
        if line is None:
            raise RuntimeError(f"the Go load exited ({self.proc.wait()})")
        return line

    def send_all(self, *cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_command(cmd))
        self.proc.stdin.flush()
        self.sent.append(str(cmd[0]))

    def collect(self, timeout: float) -> list[Any]:
        return [decode_answer(self.sent.pop(0), self._recv_line(timeout))]

    def ask(self, *cmd: Any, timeout: float = 120.0) -> list[Any]:
        self.send_all(*cmd)
        return self.collect(timeout)

    def ask_one(self, k: int, *cmd: Any, timeout: float = 120.0) -> Any:
        return self.ask(*cmd, timeout=timeout)[0]

    def cpu_seconds(self) -> float:
        return cpu_seconds(psutil.Process(self.proc.pid))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask("stop", timeout=30)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def make_load(addr: str, group: str, n: int, args: argparse.Namespace) -> Load:
    if args.load == "go":
        return GoLoad(args.go_binary, addr, group, n, args.interval, args.connections)
    connections = n if args.connections == 0 else args.connections
    return Workers(addr, group, n, args.workers, args.interval, connections)


def raise_nofile() -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one (a connection per sidecar is a file
    descriptor in the load and one in the assigner, which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def parse_connections(value: str) -> int:
    """``--connections``: a count, or per-sidecar (0: one each, as real sidecars)."""
    if value == "per-sidecar":
        return 0
    count = int(value)
    if count < 1:
        raise argparse.ArgumentTypeError("a count >= 1 or per-sidecar")
    return count


SATURATION_CPU = 0.95  # of one core: the assigner is one asyncio process
SATURATION_ACKED = 0.97  # of the heartbeats offered
SWEEP_SIZES = (1000, 2000, 3000, 5000, 7000, 10000)


def sweep_sizes(max_sidecars: int) -> list[int]:
    """1,000, 2,000, 3,000, 5,000, 7,000, 10,000, then +5,000 a step, up to the maximum."""
    sizes = [n for n in SWEEP_SIZES if n <= max_sidecars]
    nxt = SWEEP_SIZES[-1] + 5000
    while nxt <= max_sidecars:
        sizes.append(nxt)
        nxt += 5000
    if not sizes or sizes[-1] != max_sidecars:
        sizes.append(max_sidecars)
    return sizes


def saturated(n: int, interval: float, hb: dict[str, float]) -> list[str]:
    """Why one assigner core no longer keeps up with ``n`` sidecars (empty: it does): its
    CPU at 95 % of a core, fewer than 97 % of the offered heartbeats acked, or the p99 ack
    latency past the lease safety margin (a renewal that late shortens every lease)."""
    reasons = []
    if hb["cpu_share"] >= SATURATION_CPU:
        reasons.append(f"assigner CPU {hb['cpu_share']:.0%} >= {SATURATION_CPU:.0%} of a core")
    offered = n / interval
    if hb["rate"] < SATURATION_ACKED * offered:
        reasons.append(f"acked {hb['rate']:.0f}/s < {SATURATION_ACKED:.0%} of {offered:.0f}/s")
    if not hb["p99_ms"] <= SAFETY_MARGIN * 1000:  # NaN (nothing acked) counts as late
        reasons.append(f"p99 ack {hb['p99_ms']:.0f} ms > margin {SAFETY_MARGIN * 1000:.0f} ms")
    return reasons


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()  # /proc/<pid>/stat: this process's user + system time
    return float(times.user + times.system)


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (installed separately) sampling ``pid`` for the window: native frames, only
    threads on the CPU (the shares are of the assigner's CPU), speedscope format."""
    out.parent.mkdir(parents=True, exist_ok=True)
    beside = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [
            str(beside) if beside.exists() else "py-spy",
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--native",
            "--format",
            "speedscope",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
    )


def summarise(acks: int, latencies: list[float], seconds: float, cpu: float) -> dict[str, float]:
    lat = sorted(latencies) or [float("nan")]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return {
        "rate": acks / seconds,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": p99 * 1000,
        "cpu_share": cpu / seconds,
        "per_cpu_s": acks / cpu if cpu > 0 else float("nan"),
    }


def measure(
    workers: Load,
    proc: psutil.Process,
    seconds: float,
    baseline: bool,
    profile: Path | None = None,
) -> dict[str, float]:
    # CLOCK_MONOTONIC is system-wide: the workers share it. The baseline's loops start at
    # random phases within an interval: the window opens once they all run.
    t0 = time.monotonic() + (1.0 + workers.interval if baseline else 0.3)
    if baseline:
        workers.send_all("baseline", t0, t0 + seconds)
    else:
        workers.ask("window", t0, t0 + seconds)
    time.sleep(max(0.0, t0 - time.monotonic()))
    cpu0, clients0 = cpu_seconds(proc), workers.cpu_seconds()
    spy = start_profile(proc.pid, seconds, profile) if profile is not None else None
    time.sleep(seconds)
    cpu = cpu_seconds(proc) - cpu0
    clients = workers.cpu_seconds() - clients0
    if spy is not None:
        spy.wait(60)
    if baseline:
        answers = [a[1:] for a in workers.collect(seconds + 60)]
    else:
        time.sleep(ACK_GRACE)  # acks of heartbeats sent before the end still count
        answers = workers.ask("results")
    acks = sum(a[0] for a in answers)
    latencies = [x for a in answers for x in a[1]]
    errors = sum(sum(a[2].values()) for a in answers)
    return summarise(acks, latencies, seconds, cpu) | {
        "errors": float(errors),
        "clients_cpu_share": clients / seconds,
    }


def run_echo(
    setup: str, topic: str, n: int, partitions: int, args: argparse.Namespace
) -> dict[str, float]:
    """The floor row: the same sidecars, pacing and messages against :class:`EchoServicer`
    in its own process (its CPU measured as the assigner's is)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=echo_entry, args=(child, topic, partitions, n, setup), daemon=True)
    proc.start()
    try:
        if not parent.poll(120):
            raise RuntimeError(f"the echo server ({setup}) did not start")
        port = parent.recv()
        workers = make_load(f"127.0.0.1:{port}", "echo", n, args)
        try:
            workers.ask("sessions")
            started = time.monotonic()
            while time.monotonic() - started < args.warmup:
                time.sleep(0.5)
                if sum(s[0] for s in workers.ask("status")) == partitions:
                    break  # every partition granted and renewed once
            return measure(workers, psutil.Process(proc.pid), args.seconds, baseline=False)
        finally:
            workers.close()
    finally:
        with contextlib.suppress(Exception):
            parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def run_size(
    addr: str,
    group: str,
    n: int,
    partitions: int,
    args: argparse.Namespace,
    pid: int,
    baseline: bool = True,
) -> tuple[dict[str, float] | None, dict[str, float], dict[str, float]]:
    proc = psutil.Process(pid)
    workers = make_load(addr, group, n, args)
    try:
        base = measure(workers, proc, args.seconds, baseline=True) if baseline else None
        workers.ask("sessions", args.ramp)
        # Warm-up: every sidecar started, every partition held, no grant or revoke for 1 s.
        started = time.monotonic()
        last_changes, stable_since, held, joined = -1, time.monotonic(), 0, 0
        while time.monotonic() - started < args.warmup + args.ramp:
            time.sleep(0.5)
            status = workers.ask("status")
            held = sum(s[0] for s in status)
            changes = sum(s[1] for s in status)
            joined = sum(s[2] for s in status)
            if changes != last_changes:
                last_changes, stable_since = changes, time.monotonic()
            elif (
                held == partitions
                and time.monotonic() - stable_since >= 1.0
                and time.monotonic() - started >= args.ramp
            ):
                break
        settled = time.monotonic() - started
        profile = args.profile / f"assigner-{n}.speedscope.json" if args.profile else None
        hb = measure(workers, proc, args.seconds, baseline=False, profile=profile)
        status = workers.ask("status")
        held_after = sum(s[0] for s in status)
        rejoins = sum(s[3] for s in status)
        # One sidecar killed: until every partition it held is live elsewhere.
        lost = workers.ask_one(0, "kill")  # the sidecar of process 0 holding the most
        killed_at = time.monotonic()
        workers.ask("watch", lost)
        live: dict[TP, float] = {}
        while time.monotonic() - killed_at < 60 and len(live) < len(lost):
            time.sleep(0.1)
            for answer in workers.ask("live"):
                for tp, at in answer.items():
                    live[tp] = min(at, live.get(tp, at))
        replace = {
            "partitions": float(len(lost)),
            "replaced": float(len(live)),
            "seconds": (max(live.values()) - killed_at) if live else float("nan"),
        }
        hb |= {
            "settle_s": settled,
            "joined": float(joined),
            "held": float(held),
            "held_after": float(held_after),
            "rejoins": float(rejoins),
        }
        return base, hb, replace
    finally:
        workers.close()


def echo_rows() -> list[tuple[str, str]]:
    """The floor rows: the echo on a bare server, on ours, and on uvloop when installed."""
    rows = [("echo, bare server", "bare"), ("echo, our server", "ours")]
    if importlib.util.find_spec("uvloop") is not None:
        rows += [("echo, ours, uvloop", "ours+uvloop")]
    return rows


def cpu_ratio(base: dict[str, float], hb: dict[str, float]) -> float:
    """CPU per heartbeat over CPU per call of ``base``: how many times dearer."""
    return base["per_cpu_s"] / hb["per_cpu_s"] if hb["per_cpu_s"] else float("nan")


KRAFT_BATCH = 5000  # KRaft refuses a request of more than 10,000 metadata records


def create_big_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """The topic, created with at most 5,000 partitions and grown 5,000 at a time: a
    10,000-partition CreateTopics is refused ("excessively large batch operation")."""
    create_topic(bootstrap, topic, min(partitions, KRAFT_BATCH), timeout=600)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    count = min(partitions, KRAFT_BATCH)
    while count < partitions:
        count = min(partitions, count + KRAFT_BATCH)
        futures = admin.create_partitions([NewPartitions(topic, count)], request_timeout=600)
        futures[topic].result(600)
    wait_partitions(admin, topic, partitions)


def wait_partitions(admin: AdminClient, topic: str, partitions: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=30).topics[topic]
        if len(meta.partitions) == partitions and all(
            p.leader >= 0 for p in meta.partitions.values()
        ):
            return
        time.sleep(1)
    raise RuntimeError(f"{topic}: {partitions} partitions not all led after 600 s")


def start_assigner(bootstrap: str, topic: str, groups: list[str], log_dir: Path) -> ServiceProcess:
    config = log_dir / "assigner.yaml"
    # join_rate 0: joins unthrottled (issue 36's admission policy), so the sizes attach as
    # before and what is measured stays heartbeats and re-placement, not admission.
    config.write_text(
        "join_rate: 0\ngroups:\n"
        + "".join(f"  - name: {g}\n    topics: [{topic}]\n" for g in groups)
    )
    grpc_port, http_port = free_ports(2)
    assigner = ServiceProcess(
        "assigner",
        ["--bootstrap", bootstrap, "--config", str(config)],
        log_dir / "assigner.log",
        grpc_port,
        http_port,
    )
    assigner.start()
    try:
        assigner.wait_serving(timeout=120)
    except BaseException:
        assigner.kill()
        raise
    return assigner


def load_description(args: argparse.Namespace) -> str:
    conns = (
        "one HTTP/2 connection per sidecar"
        if args.connections == 0
        else f"{args.connections} HTTP/2 connections shared"
    )
    clients = (
        "1 Go process (clients/go/cmd/sessionload)"
        if args.load == "go"
        else f"{args.workers} Python client processes"
    )
    ramp = f"joins spread over {args.ramp:g} s" if args.ramp > 0 else "all joining at once"
    return f"{clients}, {conns}, {ramp}"


def print_row(n: int, what: str, r: dict[str, float], interval: float) -> None:
    print(
        f"{n:>8} {what:<20} {r['rate']:>8.0f} {r['p50_ms']:>8.1f} "
        f"{r['p99_ms']:>8.1f} {r['cpu_share']:>11.0%} {r['per_cpu_s']:>9.0f} "
        f"{r['per_cpu_s'] * interval:>13.0f} {r['clients_cpu_share']:>11.0%}"
    )


def print_size(
    n: int, partitions: int, hb: dict[str, float], replace: dict[str, float], interval: float
) -> None:
    """One size of the saturation sweep, its summary line."""
    print(
        f"{n:>8} {hb['held']:>8.0f}/{partitions:<6} {hb['rate']:>8.0f} "
        f"{hb['cpu_share']:>8.0%} {hb['clients_cpu_share']:>8.0%} "
        f"{hb['per_cpu_s'] * interval:>9.0f} {hb['p50_ms']:>7.1f} {hb['p99_ms']:>8.1f} "
        f"{hb['rejoins']:>7.0f} {replace['seconds']:>8.2f}s "
        f"({replace['replaced']:.0f}/{replace['partitions']:.0f})"
    )


SIZE_HEADER = (
    f"{'sidecars':>8} {'held/partitions':<15} {'acked/s':>8} {'assigner':>8} {'clients':>8} "
    f"{'/core':>9} {'p50 ms':>7} {'p99 ms':>8} {'rejoins':>7} {'re-place':>9}"
)


def run_sweep(bootstrap: str, args: argparse.Namespace, log_dir: Path) -> None:
    """Raise the sidecar count until one assigner core no longer keeps up (:func:`saturated`);
    print the last size it held and the first it did not. Each size has its own topic
    (``--partitions``, default max(2,000, sidecars): every sidecar can hold one) and its own
    assigner process, so no size pays for the members a smaller one left behind."""
    interval = args.interval
    print(SIZE_HEADER)
    Row = tuple[int, int, dict[str, float], dict[str, float], list[str]]
    rows: list[Row] = []
    for n in args.sidecars:
        partitions = args.partitions or max(2000, n)
        topic = f"bench-session-{n}-{int(time.time())}"
        create_big_topic(bootstrap, topic, partitions)
        (log_dir / f"{n}").mkdir(parents=True, exist_ok=True)
        assigner = start_assigner(bootstrap, topic, [f"bench-{n}"], log_dir / f"{n}")
        try:
            assert assigner.proc is not None
            _, hb, replace = run_size(
                assigner.grpc_addr, f"bench-{n}", n, partitions, args, assigner.proc.pid, False
            )
        finally:
            assigner.stop()
            with contextlib.suppress(Exception):
                delete_topic(bootstrap, topic)
        reasons = saturated(n, interval, hb)
        rows.append((n, partitions, hb, replace, reasons))
        print_size(n, partitions, hb, replace, interval)
        print(
            f"{n:>8} {'did not keep up: ' + '; '.join(reasons) if reasons else 'kept up'}; "
            f"settled in {hb['settle_s']:.1f}s ({hb['joined']:.0f} attached); "
            f"{hb['errors']:.0f} streams broken since they started; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        if reasons:
            break
    held = [r for r in rows if not r[4]]
    lost = [r for r in rows if r[4]]
    print(
        f"saturation at {interval:g} s heartbeats (assigner CPU >= {SATURATION_CPU:.0%} of a "
        f"core, acked < {SATURATION_ACKED:.0%} of offered, or p99 ack > "
        f"{SAFETY_MARGIN * 1000:.0f} ms); re-place: kill -9 of the sidecar holding the most, "
        f"until each of its partitions is live elsewhere (seen/held):"
    )
    print(SIZE_HEADER)
    for r in held[-1:] + lost[:1]:
        print_size(r[0], r[1], r[2], r[3], interval)
    if not held:
        print("  (no size held)")
    if not lost:
        print(f"  (held up to --max-sidecars {args.sidecars[-1]})")


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # rows as measured
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecars", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument(
        "--partitions", type=int, help="topic partitions (default max(2000, largest size))"
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval; 0: closed")
    parser.add_argument(
        "--load",
        choices=["go", "python"],
        help="the simulated sidecars in one Go process (default when Go is installed) or "
        "in --workers Python processes",
    )
    parser.add_argument("--workers", type=int, default=3, help="Python client processes")
    parser.add_argument(
        "--connections",
        type=parse_connections,
        default=48,
        help="HTTP/2 connections the sidecars share, or per-sidecar (one each, as real ones)",
    )
    parser.add_argument("--warmup", type=float, default=60.0, help="at most this long to settle")
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="start the sidecars at uniform random times over this many seconds (0: at once, "
        "a join storm); the warm-up is this plus --warmup",
    )
    parser.add_argument(
        "--saturate",
        action="store_true",
        help="raise the sidecars 1,000, 2,000, 3,000, 5,000, ... until one assigner core "
        "no longer keeps up (no baseline or floor rows)",
    )
    parser.add_argument("--max-sidecars", type=int, default=10000, help="--saturate's last size")
    parser.add_argument("--bootstrap", help="reuse this Kafka instead of starting one")
    parser.add_argument("--short", action="store_true", help="CI profile: 20 sidecars, 3 s")
    parser.add_argument("--log-dir", type=Path, help="keep Kafka and assigner logs here")
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the echo rows (the Session stream with no assigner behind it)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the assigner in each heartbeat window into DIR"
    )
    args = parser.parse_args(argv)
    if args.short:
        args.sidecars, args.partitions, args.seconds, args.workers = [20], 100, 3.0, 2
        args.warmup = 20.0
    if args.saturate:
        if args.interval <= 0:
            parser.error("--saturate measures sidecars at a heartbeat interval: not with 0")
        args.sidecars, args.floor = sweep_sizes(args.max_sidecars), False
    if args.partitions is None and not args.saturate:
        args.partitions = max(2000, *args.sidecars)
    go = go_toolchain()
    if args.load == "go" and go is None:
        parser.error("--load go: no Go toolchain ($GO, go on PATH, /usr/local/go/bin/go)")
    if args.load in (None, "go") and go is not None:
        try:
            args.go_binary, args.load = build_go_load(go), "go"
        except subprocess.CalledProcessError:
            if args.load == "go":
                raise
            print("the Go load did not build: the sidecars run in Python processes")
    if args.load is None:
        args.load = "python"
    soft, hard = raise_nofile()
    if args.connections == 0 and max(args.sidecars) + 1000 > soft:
        parser.error(f"--connections per-sidecar: open files limited to {soft} (hard {hard})")

    with tempfile.TemporaryDirectory(prefix="bench-session-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        cluster = None
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            cluster = KafkaCluster(KafkaOptions(brokers=1, base_dir=log_dir / "kafka"))
            t = time.monotonic()
            cluster.start()
            bootstrap = cluster.bootstrap
            print(f"kafka started in {time.monotonic() - t:.1f}s ({bootstrap})")
        if args.saturate:
            try:
                print(
                    f"saturation sweep {args.sidecars}; a topic of --partitions (default "
                    f"max(2000, sidecars)) and an assigner per size; {args.seconds:g} s windows; "
                    f"heartbeats every {args.interval:g} s; TTL {TTL:g} s; load: "
                    f"{load_description(args)}; open files {soft}; load average "
                    f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
                )
                run_sweep(bootstrap, args, log_dir)
            finally:
                if cluster is not None:
                    cluster.stop()
            return 0
        topic = f"bench-session-{int(time.time())}"
        assigner = None
        try:
            t = time.monotonic()
            create_big_topic(bootstrap, topic, args.partitions)
            print(f"topic {topic} with {args.partitions} partitions in {time.monotonic() - t:.1f}s")
            groups = [f"bench-{i}-{n}" for i, n in enumerate(args.sidecars)]
            assigner = start_assigner(bootstrap, topic, groups, log_dir)
            assert assigner.proc is not None
            pid = assigner.proc.pid
            pacing = f"every {args.interval:g} s" if args.interval > 0 else "closed loop"
            print(
                f"assigner pid {pid}; {args.partitions} partitions; "
                f"{args.seconds:g} s per measurement; heartbeats {pacing}; TTL {TTL:g} s; "
                f"load: {load_description(args)}; open files {soft}; "
                f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
            )
            print(
                f"{'sidecars':>8} {'what':<20} {'acked/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'assigner CPU':>12} {'per CPU-s':>9} {'sidecars/core':>13} {'clients CPU':>11}"
            )
            interval = args.interval if args.interval > 0 else 1.0
            for n, group in zip(args.sidecars, groups, strict=True):
                floors = [
                    (what, run_echo(setup, topic, n, args.partitions, args))
                    for what, setup in echo_rows()
                    if args.floor
                ]
                base, hb, replace = run_size(
                    assigner.grpc_addr, group, n, args.partitions, args, pid
                )
                assert base is not None
                rows = [("health Check (base)", base), *floors, ("Session heartbeats", hb)]
                for what, r in rows:
                    print_row(n, what, r, interval)
                if any(r["errors"] for _, r in rows):
                    failed = ", ".join(f"{what} {r['errors']:.0f}" for what, r in rows)
                    print(f"{n:>8} failed calls: {failed} (broken streams, re-attached)")
                ratios = "".join(
                    f" / per {what.split(' (')[0]} message {cpu_ratio(r, hb):.2f}"
                    for what, r in floors
                )
                print(
                    f"{n:>8} CPU per heartbeat / per health check {cpu_ratio(base, hb):.2f}"
                    f"{ratios}; load average {os.getloadavg()[0]:.2f}; settled in "
                    f"{hb['settle_s']:.1f}s ({hb['joined']:.0f} attached); partitions held "
                    f"{hb['held']:.0f}/{args.partitions} "
                    f"(after the window {hb['held_after']:.0f}); {hb['rejoins']:.0f} sessions "
                    f"re-attached after the assigner dropped them as lost; kill -9 of one sidecar: "
                    f"{replace['replaced']:.0f}/{replace['partitions']:.0f} of its partitions "
                    f"live elsewhere after {replace['seconds']:.2f}s "
                    f"(TTL + grace {TTL + GRACE:g}s)"
                )
        finally:
            if assigner is not None:
                assigner.stop()
            with contextlib.suppress(Exception):
                delete_topic(bootstrap, topic)
            if cluster is not None:
                cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
