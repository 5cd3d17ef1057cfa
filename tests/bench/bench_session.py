"""How many sidecar heartbeats per second one assigner process handles.

    python tests/bench/bench_session.py [--sidecars 100 500 --partitions 1000 --seconds 10]
    python tests/bench/bench_session.py --short      # CI profile: 20 sidecars, 100 partitions, 3 s
    python tests/bench/bench_session.py --bootstrap 127.0.0.1:9092   # reuse a running Kafka

Starts a real Kafka (1 KRaft broker from deploy/kafka, unless ``--bootstrap``), a topic with
``--partitions`` partitions, and a real ``ds-assigner`` process with one group per run.
Then, from this one client process (grpc.aio), N simulated sidecars open a ``Session``
stream each, join, release whatever they are revoked in their next heartbeat, and send a
heartbeat carrying all their leases as soon as the ack of the previous one arrives (closed
loop). After a warm-up (the assignment settles), acked heartbeats are counted for
``--seconds``, with ack latency p50/p99 and the assigner's CPU use.

Baseline, same run, same process, same concurrency: gRPC health ``Check`` round trips (a
trivial unary call) per second. Printed: both rates and the ratio heartbeats/baseline.
Nothing is asserted about time (ARCHITECTURE §9, benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic, delete_topic
from services.devstack.ports import free_ports
from tests.support.mesh import ServiceProcess


@dataclass
class SimSidecar:
    """One simulated sidecar: a Session stream driven in a closed heartbeat loop."""

    sid: str
    group: str
    leases: dict[tuple[str, int], int] = field(default_factory=dict)  # tp -> epoch
    released: list[assigner_pb2.ReleasedLease] = field(default_factory=list)
    seq: int = 0
    sent_at: float = 0.0
    outbox: asyncio.Queue[assigner_pb2.SessionRequest | None] = field(default_factory=asyncio.Queue)
    lease_changes: int = 0

    def join(self) -> assigner_pb2.SessionRequest:
        return assigner_pb2.SessionRequest(
            join=assigner_pb2.SessionJoin(
                sidecar_id=self.sid, group=self.group, endpoint=f"127.0.0.1:1/{self.sid}"
            )
        )

    def heartbeat(self) -> assigner_pb2.SessionRequest:
        self.seq += 1
        released, self.released = self.released, []
        return assigner_pb2.SessionRequest(
            heartbeat=assigner_pb2.SessionHeartbeat(
                seq=self.seq,
                leases=[
                    assigner_pb2.LeaseProgress(
                        topic=t, partition=p, epoch=e, position=100, committed_offset=100
                    )
                    for (t, p), e in self.leases.items()
                ],
                released_leases=released,
            )
        )

    async def requests(self) -> AsyncIterator[assigner_pb2.SessionRequest]:
        while (request := await self.outbox.get()) is not None:
            yield request


@dataclass
class Stats:
    window: tuple[float, float] = (0.0, 0.0)
    acks: int = 0
    latencies: list[float] = field(default_factory=list)

    def record(self, sent: float, now: float) -> None:
        if self.window[0] <= sent and now <= self.window[1]:
            self.acks += 1
            self.latencies.append(now - sent)


async def drive(sim: SimSidecar, stub: assigner_pb2_grpc.AssignerServiceStub, stats: Stats) -> None:
    sim.outbox.put_nowait(sim.join())
    call = stub.Session(sim.requests())
    try:
        async for response in call:
            kind = response.WhichOneof("kind")
            if kind == "accepted":
                sim.sent_at = time.monotonic()
                sim.outbox.put_nowait(sim.heartbeat())
            elif kind == "grant":
                g = response.grant
                sim.leases[(g.topic, g.partition)] = g.epoch
                sim.lease_changes += 1
            elif kind == "revoke":
                r = response.revoke
                epoch = sim.leases.pop((r.topic, r.partition), r.epoch)
                sim.released.append(
                    assigner_pb2.ReleasedLease(
                        topic=r.topic, partition=r.partition, epoch=epoch, committed_offset=100
                    )
                )
                sim.lease_changes += 1
            elif kind == "heartbeat_ack" and response.heartbeat_ack.seq == sim.seq:
                now = time.monotonic()
                stats.record(sim.sent_at, now)
                sim.sent_at = now
                sim.outbox.put_nowait(sim.heartbeat())
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.CANCELLED:
            raise


async def health_loop(stub: health_pb2_grpc.HealthStub, stats: Stats, until: float) -> None:
    request = health_pb2.HealthCheckRequest()
    while (sent := time.monotonic()) < until:
        await stub.Check(request, timeout=10)
        stats.record(sent, time.monotonic())


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def channels(addr: str, n: int) -> list[grpc.aio.Channel]:
    # A few HTTP/2 connections, as many real sidecars would open one each.
    return [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(n)
    ]


async def run_heartbeats(
    addr: str, group: str, n: int, partitions: int, warmup_max: float, seconds: float, pid: int
) -> dict[str, float]:
    chans = channels(addr, min(8, n))
    stubs = [assigner_pb2_grpc.AssignerServiceStub(c) for c in chans]
    sims = [SimSidecar(f"sim-{i:04d}", group) for i in range(n)]
    stats = Stats(window=(float("inf"), 0.0))
    tasks = [
        asyncio.create_task(drive(s, stubs[i % len(stubs)], stats)) for i, s in enumerate(sims)
    ]
    # Warm-up: every partition held, and no grant or revoke for 1 s.
    started = time.monotonic()
    last_changes, stable_since = -1, time.monotonic()
    while time.monotonic() - started < warmup_max:
        await asyncio.sleep(0.2)
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        changes = sum(s.lease_changes for s in sims)
        held = sum(len(s.leases) for s in sims)
        if changes != last_changes:
            last_changes, stable_since = changes, time.monotonic()
        elif held == partitions and time.monotonic() - stable_since >= 1.0:
            break
    settled = time.monotonic() - started
    held = sum(len(s.leases) for s in sims)
    proc = psutil.Process(pid)
    cpu0 = cpu_seconds(proc)
    t0 = time.monotonic()
    stats.window = (t0, t0 + seconds)
    await asyncio.sleep(seconds + 0.2)
    cpu = cpu_seconds(proc) - cpu0
    for s in sims:
        s.outbox.put_nowait(None)
    for t in tasks:
        t.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await asyncio.gather(*tasks, return_exceptions=True)
    for c in chans:
        await c.close()
    return summarise(stats, seconds, cpu) | {"settle_s": settled, "held": held}


async def run_baseline(addr: str, n: int, seconds: float, pid: int) -> dict[str, float]:
    chans = channels(addr, min(8, n))
    stubs = [health_pb2_grpc.HealthStub(c) for c in chans]
    stats = Stats()
    # Warm the connections, then measure.
    await asyncio.gather(*(s.Check(health_pb2.HealthCheckRequest(), timeout=10) for s in stubs))
    proc = psutil.Process(pid)
    cpu0 = cpu_seconds(proc)
    t0 = time.monotonic()
    stats.window = (t0, t0 + seconds)
    await asyncio.gather(
        *(health_loop(stubs[i % len(stubs)], stats, t0 + seconds) for i in range(n))
    )
    cpu = cpu_seconds(proc) - cpu0
    for c in chans:
        await c.close()
    return summarise(stats, seconds, cpu)


def summarise(stats: Stats, seconds: float, cpu: float) -> dict[str, float]:
    lat = sorted(stats.latencies) or [float("nan")]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return {
        "rate": stats.acks / seconds,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": p99 * 1000,
        "cpu_share": cpu / seconds,
        "per_cpu_s": stats.acks / cpu if cpu > 0 else float("nan"),
    }


def start_assigner(bootstrap: str, topic: str, groups: list[str], log_dir: Path) -> ServiceProcess:
    config = log_dir / "assigner.yaml"
    config.write_text(
        "groups:\n" + "".join(f"  - name: {g}\n    topics: [{topic}]\n" for g in groups)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecars", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--bootstrap", help="reuse this Kafka instead of starting one")
    parser.add_argument("--short", action="store_true", help="CI profile: 20 sidecars, 3 s")
    parser.add_argument("--log-dir", type=Path, help="keep Kafka and assigner logs here")
    args = parser.parse_args(argv)
    if args.short:
        args.sidecars, args.partitions, args.seconds = [20], 100, 3.0
    warmup_max = 30.0 if not args.short else 15.0

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
        topic = f"bench-session-{int(time.time())}"
        assigner = None
        try:
            create_topic(bootstrap, topic, args.partitions)
            groups = [f"bench-{n}" for n in args.sidecars]
            assigner = start_assigner(bootstrap, topic, groups, log_dir)
            assert assigner.proc is not None
            pid = assigner.proc.pid
            print(
                f"assigner pid {pid}; topic {topic} with {args.partitions} partitions; "
                f"{args.seconds:.0f} s per measurement; TTL 3 s, heartbeat interval 1 s"
            )
            print(
                f"{'sidecars':>8} {'what':<22} {'per s':>9} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'assigner CPU':>12} {'per CPU-s':>10}"
            )
            for n, group in zip(args.sidecars, groups, strict=True):
                base = asyncio.run(run_baseline(assigner.grpc_addr, n, args.seconds, pid))
                hb = asyncio.run(
                    run_heartbeats(
                        assigner.grpc_addr, group, n, args.partitions, warmup_max, args.seconds, pid
                    )
                )
                for what, r in (("health Check (base)", base), ("Session heartbeats", hb)):
                    print(
                        f"{n:>8} {what:<22} {r['rate']:>9.0f} {r['p50_ms']:>8.2f} "
                        f"{r['p99_ms']:>8.2f} {r['cpu_share']:>11.0%} {r['per_cpu_s']:>10.0f}"
                    )
                need = n / 1.0  # heartbeats/s the group needs at the default 1 s interval
                print(
                    f"{n:>8} ratio heartbeats/baseline {hb['rate'] / base['rate']:.2f}; "
                    f"settled in {hb['settle_s']:.1f}s with {hb['held']:.0f}/{args.partitions} "
                    f"partitions held; capacity {hb['rate'] / need:.1f}x what {n} sidecars "
                    f"need at a 1 s heartbeat interval"
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
