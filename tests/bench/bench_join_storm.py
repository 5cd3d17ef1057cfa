"""A reconnect storm at twice the measured join capacity, with sidecars attached (issue 36).

    python tests/bench/bench_join_storm.py [--bootstrap HOST:PORT] [--attached 10]
        [--join-rates 20 100] [--probe-seconds 6] [--storm-seconds 5]
        [--json docs/benchmarks/results/join_storm.json]

A real ``ds-assigner`` process (its own state topic and transactional id) with three groups
on one topic, and simulated sidecars in this process (``bench_session.SimSidecar``: a
``Session`` stream, a join, heartbeats every second naming the leases held, each lease kept
as ``services/consumer_sidecar`` keeps it). Every failed join waits as the real sidecar's
session loop does: ``dsclient.connection.pause_before_retry`` over the sidecar's
``RECONNECT_BACKOFF``, at least the assigner's retry-after (JOIN_THROTTLED
``retry_after_ms``) plus up to half of it again (the jitter).

1. **Attached**: ``--attached`` sidecars join group ``attached`` and settle (every
   partition held, no grant or revoke for 2 s). A quiet window as long as the storm's
   measures their longest pause between heartbeat acks: the baseline.
2. **Capacity**: ``--probe`` sidecars (default enough to keep the assigner busy for
   ``--probe-seconds``) join group ``probe`` all at once, each retrying after its
   retry-after; the joins accepted per second after the first (the burst) is the measured
   capacity (the admission's refill rate, or less when the assigner's CPU cannot keep up).
3. **Storm**: new sidecars join group ``storm`` at twice that capacity for
   ``--storm-seconds``, retrying as above, until every one has attached.

Printed: the capacity; the storm's joins, refusals (JOIN_THROTTLED) and time to attach
(first attempt to ``accepted``: p50, p99, max); the attached sidecars' longest pause
between heartbeat acks during the storm (and in the quiet window before it), their longest
ack latency, and their lease changes after settling (grants, revokes, lapses: must be 0).
Nothing is asserted about time (ARCHITECTURE §9). ``--json`` writes the result file the
benchmark pages render (tests/support/bench_results.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

import itertools

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from dsclient.connection.policy import pause_before_retry
from dsclient.reasons import Reason, error_info, retry_after
from services.consumer_sidecar.session import RECONNECT_BACKOFF
from services.devstack.kafka import create_topic, delete_topic
from services.devstack.ports import free_ports
from tests.bench.bench_session import SAFETY_MARGIN, TTL, Lease, SimSidecar
from tests.support.bench_results import write_result
from tests.support.mesh import ServiceProcess

INTERVAL = 1.0  # the default heartbeat interval


@dataclass
class Joiner:
    """One simulated sidecar's Session loop and what it measured."""

    sim: SimSidecar
    first_try: float = 0.0
    attached_at: float | None = None
    throttled: int = 0
    other_errors: int = 0
    codes: dict[str, int] = field(default_factory=dict)  # failed sessions by status code
    acks: list[float] = field(default_factory=list)  # receive times
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (sent, latency)
    task: asyncio.Task[None] | None = None

    async def run(self, stub: assigner_pb2_grpc.AssignerServiceAsyncStub) -> None:
        retries = 0
        self.first_try = time.monotonic()
        while not self.sim.killed:
            asked = None
            try:
                await self._session(stub)
                retries = 0
            except grpc.aio.AioRpcError as err:
                if self.sim.killed:
                    return
                info = error_info(err)
                if info is not None and info.reason == Reason.JOIN_THROTTLED.value:
                    self.throttled += 1
                else:
                    self.other_errors += 1
                self.codes[err.code().name] = self.codes.get(err.code().name, 0) + 1
                asked = retry_after(err)
            pause = pause_before_retry(RECONNECT_BACKOFF, retries, random.random(), asked)
            retries += 1
            await asyncio.sleep(pause)

    async def _session(self, stub: assigner_pb2_grpc.AssignerServiceAsyncStub) -> None:
        sim = self.sim
        outbox: asyncio.Queue[assigner_pb2.SessionRequest | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[assigner_pb2.SessionRequest]:
            while (request := await outbox.get()) is not None:
                yield request

        async def pace() -> None:
            await asyncio.sleep(random.uniform(0, INTERVAL))
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sim.wake.wait(), INTERVAL)
                sim.wake.clear()
                outbox.put_nowait(sim.heartbeat(time.monotonic()))

        sim.seq, sim.sent = 0, {}
        outbox.put_nowait(sim.join(time.monotonic()))
        sim.call = call = stub.Session(requests())
        pacer = None
        try:
            async for response in call:
                kind = response.WhichOneof("kind")
                now = time.monotonic()
                if kind == "accepted":
                    sim.joined = True
                    if self.attached_at is None:
                        self.attached_at = now
                    pacer = asyncio.create_task(pace())
                elif kind in ("grant", "revoke"):
                    apply_assignment(sim, response, now)
                elif kind == "heartbeat_ack":
                    sent = sim.on_ack(response.heartbeat_ack, now)
                    if sent is not None:
                        self.acks.append(now)
                        self.latencies.append((sent, now - sent))
        finally:
            if pacer is not None:
                pacer.cancel()
            outbox.put_nowait(None)
            sim.joined = False


def apply_assignment(sim: SimSidecar, response: object, now: float) -> None:
    """A grant or revoke, as bench_session.session applies it."""
    kind = response.WhichOneof("kind")  # type: ignore[attr-defined]
    if kind == "grant":
        g = response.grant  # type: ignore[attr-defined]
        sim.leases[(g.topic, g.partition)] = Lease(g.epoch, now + TTL - SAFETY_MARGIN)
    else:
        r = response.revoke  # type: ignore[attr-defined]
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


def longest_pause(acks: list[float], start: float, end: float) -> float:
    """The longest time within [start, end] with no heartbeat ack."""
    points = [start, *[t for t in acks if start < t < end], end]
    return max(b - a for a, b in itertools.pairwise(points))


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


SESSIONS_PER_CHANNEL = 50  # the server allows 1,000 streams a connection; real sidecars
# have one each: a few dozen sessions per HTTP/2 connection keeps the connection out of it


class Bench:
    def __init__(self, addr: str, topic: str, partitions: int) -> None:
        self.addr = addr
        self.channels: list[grpc.aio.Channel] = []
        self.topic, self.partitions = topic, partitions
        self.joiners: dict[str, list[Joiner]] = {}
        self.started = 0

    def _stub(self) -> assigner_pb2_grpc.AssignerServiceAsyncStub:
        if self.started % SESSIONS_PER_CHANNEL == 0:
            self.channels.append(grpc.aio.insecure_channel(self.addr))
        self.started += 1
        return assigner_pb2_grpc.AssignerServiceStub(self.channels[-1])

    def start(self, group: str, n: int) -> list[Joiner]:
        tag = uuid.uuid4().hex[:4]
        made = [Joiner(SimSidecar(f"{group}-{tag}-{i}", group)) for i in range(n)]
        for j in made:
            j.task = asyncio.create_task(j.run(self._stub()))
        self.joiners.setdefault(group, []).extend(made)
        return made

    async def settle(self, group: str, timeout: float = 120.0) -> float:
        """Until every partition is held in ``group`` and no lease changed for 2 s."""
        t0 = time.monotonic()
        last, quiet_from = -1, time.monotonic()
        while time.monotonic() - t0 < timeout:
            now = time.monotonic()
            js = self.joiners[group]
            held = sum(len(j.sim.held(now)) for j in js)
            changes = sum(j.sim.lease_changes for j in js)
            if changes != last:
                last, quiet_from = changes, now
            if held == self.partitions and now - quiet_from >= 2.0:
                return now - t0
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{group} did not settle in {timeout:.0f}s")

    async def stop(self, group: str) -> None:
        for j in self.joiners.get(group, []):
            j.sim.killed = True
            if j.sim.call is not None:
                j.sim.call.cancel()
            if j.task is not None:
                j.task.cancel()
        await asyncio.gather(
            *(j.task for j in self.joiners.get(group, []) if j.task), return_exceptions=True
        )

    async def close(self) -> None:
        for group in list(self.joiners):
            await self.stop(group)
        for channel in self.channels:
            await channel.close(None)  # grace None: the stubs omit grpc's default


async def attached_main(
    conn: multiprocessing.connection.Connection, addr: str, topic: str, n: int, partitions: int
) -> None:
    """The attached sidecars, in a process of their own (the storm's client work must not
    delay their heartbeats): settle, then report their acks when asked."""
    bench = Bench(addr, topic, partitions)
    loop = asyncio.get_running_loop()
    try:
        attached = bench.start("attached", n)
        settled = await bench.settle("attached")
        changes_at_settle = sum(j.sim.lease_changes for j in attached)
        conn.send(settled)
        while await loop.run_in_executor(None, conn.recv) == "report":
            now = time.monotonic()
            conn.send(
                {
                    "acks": [j.acks for j in attached],
                    "latencies": [x for j in attached for x in j.latencies],
                    "changes": sum(j.sim.lease_changes for j in attached) - changes_at_settle,
                    "held": sum(len(j.sim.held(now)) for j in attached),
                    "errors": sum(j.throttled + j.other_errors for j in attached),
                }
            )
    finally:
        await bench.close()


def attached_entry(
    conn: multiprocessing.connection.Connection, addr: str, topic: str, n: int, partitions: int
) -> None:
    asyncio.run(attached_main(conn, addr, topic, n, partitions))


async def run(addr: str, topic: str, args: argparse.Namespace) -> dict[str, object]:
    spawn = multiprocessing.get_context("spawn")  # no fork of a process running gRPC
    ours, theirs = spawn.Pipe()
    child = spawn.Process(
        target=attached_entry, args=(theirs, addr, topic, args.attached, args.partitions)
    )
    child.start()
    loop = asyncio.get_running_loop()
    bench = Bench(addr, topic, args.partitions)
    try:
        settled = await loop.run_in_executor(None, ours.recv)
        print(f"{args.attached} sidecars attached (their own process), {args.partitions} "
              f"partitions held, settled in {settled:.1f}s")  # fmt: skip

        # The quiet window: the baseline of the attached sidecars' pauses.
        quiet_start = time.monotonic()
        await asyncio.sleep(args.storm_seconds + args.tail)
        quiet_end = time.monotonic()

        # Capacity: a crowd of joins at once, each retrying after its retry-after.
        probe_n = args.probe or int(args.join_burst + 1.5 * args.join_rate * args.probe_seconds)
        probes = bench.start("probe", probe_n)
        t0 = time.monotonic()
        await asyncio.sleep(args.probe_seconds)
        times = sorted(j.attached_at - t0 for j in probes if j.attached_at is not None)
        after_first = [t for t in times if t >= 1.0]
        capacity = len(after_first) / (args.probe_seconds - 1.0)
        print(f"capacity: {probe_n} joins at once: {len(times)} attached in "
              f"{args.probe_seconds:g}s, {len(times) - len(after_first)} in the first second "
              f"(the burst), then {capacity:.1f} joins/s")  # fmt: skip
        await bench.stop("probe")
        await asyncio.sleep(1.0)
        ours.send("report")
        probe_report = await loop.run_in_executor(None, ours.recv)
        probe_pause = max(
            longest_pause(acks, t0, time.monotonic()) for acks in probe_report["acks"]
        )
        print(f"attached sidecars during the capacity probe: longest heartbeat-ack pause "
              f"{probe_pause:.2f}s, lease changes {probe_report['changes']}")  # fmt: skip

        # The storm: twice the capacity for --storm-seconds.
        storm_rate = 2 * capacity
        storm_n = max(1, round(storm_rate * args.storm_seconds))
        storm: list[Joiner] = []
        storm_start = time.monotonic()
        for i in range(storm_n):
            await asyncio.sleep(max(0.0, storm_start + i / storm_rate - time.monotonic()))
            storm.extend(bench.start("storm", 1))
        deadline = time.monotonic() + args.attach_timeout
        while time.monotonic() < deadline and any(j.attached_at is None for j in storm):
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.tail)
        storm_end = time.monotonic()

        attach = [j.attached_at - j.first_try for j in storm if j.attached_at is not None]
        throttled = sum(j.throttled for j in storm)
        others = sum(j.other_errors for j in storm)
        codes: dict[str, int] = {}
        for j in storm:
            for code, count in j.codes.items():
                codes[code] = codes.get(code, 0) + count
        ours.send("report")
        report = await loop.run_in_executor(None, ours.recv)
        pauses = [longest_pause(acks, storm_start, storm_end) for acks in report["acks"]]
        quiet = [longest_pause(acks, quiet_start, quiet_end) for acks in report["acks"]]
        lat = [x for s, x in report["latencies"] if storm_start <= s < storm_end]
        changes, held, attached_errors = report["changes"], report["held"], report["errors"]
        changes -= probe_report["changes"]  # the storm's own
        ours.send("stop")
        print(f"storm: {storm_n} joins at {storm_rate:.1f}/s (2 x capacity) over "
              f"{args.storm_seconds:g}s: {len(attach)} attached, refused {throttled} times "
              f"(JOIN_THROTTLED), other errors {others} {codes}; time to attach p50 "
              f"{statistics.median(attach):.2f}s p99 {quantile(attach, 0.99):.2f}s max "
              f"{max(attach):.2f}s")  # fmt: skip
        print(f"attached sidecars ({args.attached}): longest heartbeat-ack pause during the "
              f"storm {max(pauses):.2f}s (quiet window before it {max(quiet):.2f}s; interval "
              f"{INTERVAL:g}s), ack latency p99 {quantile(lat, 0.99) * 1000:.0f} ms max "
              f"{max(lat) * 1000:.0f} ms; lease changes in the storm {changes}; partitions "
              f"held {held}/{args.partitions}; session errors {attached_errors}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        return {
            "capacity_joins_per_s": round(capacity, 1),
            "probe_joins": probe_n,
            "storm_joins": storm_n,
            "storm_rate_per_s": round(storm_rate, 1),
            "storm_attached": len(attach),
            "storm_refusals": throttled,
            "storm_other_errors": others,
            "attach_p50_s": round(statistics.median(attach), 2),
            "attach_p99_s": round(quantile(attach, 0.99), 2),
            "attach_max_s": round(max(attach), 2),
            "attached_longest_pause_s": round(max(pauses), 2),
            "attached_longest_pause_quiet_s": round(max(quiet), 2),
            "attached_ack_p99_ms": round(quantile(lat, 0.99) * 1000),
            "attached_lease_changes": changes,
            "attached_longest_pause_probe_s": round(probe_pause, 2),
            "attached_lease_changes_probe": probe_report["changes"],
            "attached_partitions_held": held,
        }
    finally:
        await bench.close()
        child.join(30)
        if child.is_alive():
            child.kill()


def start_assigner(
    bootstrap: str, topic: str, args: argparse.Namespace, log_dir: Path
) -> ServiceProcess:
    config = log_dir / "assigner.yaml"
    config.write_text(
        f"join_rate: {args.join_rate:g}\njoin_burst: {args.join_burst}\ngroups:\n"
        + "".join(f"  - name: {g}\n    topics: [{topic}]\n" for g in ("attached", "probe", "storm"))
    )
    suffix = uuid.uuid4().hex[:8]
    grpc_port, http_port = free_ports(2)
    assigner = ServiceProcess(
        "assigner",
        ["--bootstrap", bootstrap, "--config", str(config)],
        log_dir / "assigner.log",
        grpc_port,
        http_port,
        env={
            "DS_STATE_TOPIC": f"__ds_assigner_state_storm_{suffix}",
            "DS_STATE_TRANSACTIONAL_ID": f"ds-assigner-state-storm-{suffix}",
        },
    )
    assigner.start()
    try:
        assigner.wait_serving(timeout=120)
    except BaseException:
        assigner.kill()
        raise
    return assigner


async def run_rates(args: argparse.Namespace, tmp: Path) -> list[dict[str, object]]:
    """A fresh assigner and topic per --join-rates value, one after the other."""
    rows: list[dict[str, object]] = []
    for rate in args.join_rates:
        args.join_rate, args.join_burst = rate, max(1, round(2 * rate))
        log_dir = (args.log_dir or tmp) / f"rate-{rate:g}"
        log_dir.mkdir(parents=True, exist_ok=True)
        topic = f"bench-storm-{uuid.uuid4().hex[:8]}"
        create_topic(args.bootstrap, topic, args.partitions)
        assigner = start_assigner(args.bootstrap, topic, args, log_dir)
        print(f"assigner {assigner.grpc_addr} join_rate {args.join_rate:g} join_burst "
              f"{args.join_burst}; topic {topic} ({args.partitions} partitions); "
              f"heartbeats every {INTERVAL:g}s")  # fmt: skip
        try:
            figures = await run(assigner.grpc_addr, topic, args)
        finally:
            assigner.stop()
            with contextlib.suppress(Exception):
                delete_topic(args.bootstrap, topic)
        rows.append({"scenario": f"join_rate {rate:g}/s, join_burst {args.join_burst}", **figures})
    return rows


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"))
    parser.add_argument("--attached", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument(
        "--join-rates",
        type=float,
        nargs="+",
        default=[20.0, 100.0],
        help="the assigner's join_rate, a run (a fresh assigner) each; join_burst 2 x rate "
        "(the defaults' ratio: 100/s, 200)",
    )
    parser.add_argument("--probe", type=int, help="joins at once to measure the capacity")
    parser.add_argument("--probe-seconds", type=float, default=6.0)
    parser.add_argument("--storm-seconds", type=float, default=5.0)
    parser.add_argument("--tail", type=float, default=3.0, help="seconds watched after")
    parser.add_argument("--attach-timeout", type=float, default=120.0)
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--json", type=Path, help="write the result file here")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap (or KAFKA_BOOTSTRAP) names the Kafka to use")
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        # One event loop for every rate: grpc.aio does not survive a second asyncio.run.
        rows = asyncio.run(run_rates(args, Path(tmp)))
    if args.json:
        path = write_result(
            "join_storm",
            title="Reconnect storm at twice the measured join capacity",
            summary=(
                "Joins at twice the capacity measured in the same run, against sidecars "
                "attached beforehand: their longest heartbeat-ack pause (beside a quiet "
                "window's) and lease changes, and the storm's time to attach."
            ),
            load={
                "attached": args.attached,
                "partitions": args.partitions,
                "join_rates": args.join_rates,
                "storm_seconds": args.storm_seconds,
                "heartbeat_interval_s": INTERVAL,
            },
            results=rows,
            out_dir=args.json.parent,
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
