"""Benchmark: consumer sidecar throughput and latency against a direct Kafka consumer.

    .venv/bin/python tests/bench/bench_sidecar.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap), produces N records of 100 B and
of 1 KiB, and measures, in the same run (CONVENTIONS "Tests": a baseline and the ratio,
never an asserted time):

(a) baseline: a confluent-kafka ``assign()`` + batch ``consume()`` loop over the same data;
(b) through a sidecar with ``Fetch`` (DsClient.fetch, large max_records, an ack per batch);
(c) through ``StreamService.Stream`` (credit-based, acks on the stream) — skipped with a
    note if the sidecar answers UNIMPLEMENTED;
(d) produce-to-client latency p50/p99 at 1,000 records/s, sidecar vs a direct consumer;
(e) (b) with librdkafka statistics on (default 5000 ms) and off
    (``DS_STATISTICS_INTERVAL_MS=0``): the overhead ratio.

Sidecar times run from the moment the sidecar answers /healthz (its session, lease grants
and Kafka fetch start-up are included, as the consumer's group join is in (a)); only one
sidecar runs at a time. Not collected by pytest (file name).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.consumer_sidecar.client import DsClient
from services.devstack.kafka import (
    KafkaCluster,
    KafkaOptions,
    create_topic,
    delete_topic,
)
from services.runtime.grpcserver import CHANNEL_OPTIONS
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.sidecar_probe import produce_bulk, start_sidecar

PARTITIONS = 8
FETCH_MAX = 10_000
STREAM_CREDIT = 20_000


@dataclass(frozen=True)
class Profile:
    records_100: int
    records_1k: int
    latency_seconds: float


SHORT = Profile(records_100=100_000, records_1k=40_000, latency_seconds=8.0)
FULL = Profile(records_100=1_000_000, records_1k=300_000, latency_seconds=30.0)


@dataclass(frozen=True)
class Rate:
    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        return f"{self.per_second:>10,.0f} rec/s ({self.records} in {self.seconds:.2f}s)"


# ---- (a) direct consumer ------------------------------------------------------------------


def direct_consume(bootstrap: str, topic: str, n: int) -> Rate:
    started = time.monotonic()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-direct-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = 0
        first: float | None = None  # steady state: from the first record to the last
        deadline = started + 300
        while got < n and time.monotonic() < deadline:
            batch = sum(1 for m in consumer.consume(FETCH_MAX, 1.0) if m.error() is None)
            if batch and first is None:
                first = time.monotonic()  # the first batch starts the clock, uncounted
                n -= batch
                continue
            got += batch
        return Rate(got, time.monotonic() - (first or started))
    finally:
        consumer.close()


# ---- (b)/(e) Fetch, (c) Stream through a sidecar ---------------------------------------


def serving_sidecar(
    mesh: Mesh, assigner: ServiceProcess, group: str, env: dict[str, str] | None = None
) -> tuple[ServiceProcess, float]:
    sidecar = start_sidecar(mesh, group, assigner, f"bench-{group[-12:]}", env=env)
    sidecar.wait_serving()
    return sidecar, time.monotonic()


def fetch_through(mesh: Mesh, assigner: ServiceProcess, group: str, n: int, env=None) -> Rate:  # type: ignore[no-untyped-def]
    sidecar, started = serving_sidecar(mesh, assigner, group, env)
    got = 0
    try:
        with DsClient(group, client_id="bench-fetch", assigner=assigner.grpc_addr) as client:
            deadline = started + 300
            first: float | None = None  # steady state: from the first record to the last
            while got < n and time.monotonic() < deadline:
                batch = client.fetch(max_records=FETCH_MAX, max_wait=1.0)
                if batch:
                    client.ack(batch)
                    if first is None:
                        first = time.monotonic()  # the first batch starts the clock, uncounted
                        n -= len(batch)
                        continue
                    got += len(batch)
        return Rate(got, time.monotonic() - (first or started))
    finally:
        sidecar.stop()


def stream_through(mesh: Mesh, assigner: ServiceProcess, group: str, n: int) -> Rate | str:
    sidecar, started = serving_sidecar(mesh, assigner, group)
    requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()

    def outgoing() -> Iterator[stream_pb2.StreamRequest]:
        while (item := requests.get()) is not None:
            yield item

    opened = stream_pb2.StreamOpen(
        client_id="bench-stream",
        group=group,
        initial_credit=stream_pb2.StreamCredit(records=STREAM_CREDIT),
    )
    requests.put(stream_pb2.StreamRequest(open=opened))
    channel = grpc.insecure_channel(sidecar.grpc_addr, options=CHANNEL_OPTIONS)
    got = 0
    first: float | None = None  # steady state: the first batch starts the clock, uncounted
    try:
        # The sidecar answers SERVICE_NOT_READY until it joined the assigner: retry that.
        deadline = started + 300
        while got < n and time.monotonic() < deadline:
            call = stream_pb2_grpc.StreamServiceStub(channel).Stream(outgoing())
            try:
                for response in call:
                    if response.WhichOneof("kind") != "batch":
                        continue
                    records = response.batch.records
                    if first is None:
                        first = time.monotonic()
                        n -= len(records)
                    else:
                        got += len(records)
                    acks = [
                        stream_pb2.RecordAck(
                            topic=r.topic,
                            partition=r.partition,
                            offset=r.offset,
                            lease_epoch=r.lease_epoch,
                        )
                        for r in records
                    ]
                    requests.put(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(acks=acks)))
                    credit = stream_pb2.StreamCredit(records=len(records))
                    requests.put(stream_pb2.StreamRequest(credit=credit))
                    if got >= n:
                        break
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return f"skipped: Stream answered UNIMPLEMENTED ({err.details()})"
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    return f"skipped: Stream failed {err.code().name}: {err.details()}"
                time.sleep(0.1)
                requests = queue.SimpleQueue()
                requests.put(stream_pb2.StreamRequest(open=opened))
                continue
            finally:
                call.cancel()
        return Rate(got, time.monotonic() - (first or started))
    finally:
        requests.put(None)
        channel.close()
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


def run(bootstrap: str, profile: Profile, log_dir: Path) -> None:
    run_id = uuid.uuid4().hex[:6]
    sizes = {100: profile.records_100, 1024: profile.records_1k}
    topics = {size: f"bench-sidecar-{size}-{run_id}" for size in sizes}
    lat_topic = f"bench-sidecar-lat-{run_id}"
    modes = ("fetch", "nostats", "stream")
    groups = [(f"g-{m}-{topics[s]}", [topics[s]]) for s in sizes for m in modes]
    groups.append((f"g-{lat_topic}", [lat_topic]))
    for topic in [*topics.values(), lat_topic]:
        create_topic(bootstrap, topic, PARTITIONS)
    try:
        with running_mesh(bootstrap, log_dir) as mesh:
            assigner = mesh.assigner(groups)
            assigner.wait_serving()
            for size, n in sizes.items():
                topic = topics[size]
                took = produce_bulk(bootstrap, topic, n, size, PARTITIONS)
                print(f"\n== {n} records x {size} B (produced in {took:.1f}s)", flush=True)
                base = direct_consume(bootstrap, topic, n)
                print(f"(a) direct consume() baseline     {base}", flush=True)
                fetch = fetch_through(mesh, assigner, f"g-fetch-{topic}", n)
                print(f"(b) sidecar Fetch (stats 5000 ms) {fetch}  ratio {ratio(fetch, base)}")
                env = {"DS_STATISTICS_INTERVAL_MS": "0"}
                nostats = fetch_through(mesh, assigner, f"g-nostats-{topic}", n, env)
                print(
                    f"(e) sidecar Fetch (stats off)     {nostats}  ratio {ratio(nostats, base)}; "
                    f"stats-on/stats-off {ratio(fetch, nostats)}",
                    flush=True,
                )
                stream = stream_through(mesh, assigner, f"g-stream-{topic}", n)
                print(f"(c) sidecar Stream                {stream}  ratio {ratio(stream, base)}")
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
        for topic in [*topics.values(), lat_topic]:
            try:
                delete_topic(bootstrap, topic)
            except Exception as exc:  # a bench must still print what it measured
                print(f"could not delete {topic}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile (~20-40 s of work)")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    args = parser.parse_args()
    profile = SHORT if args.short else FULL
    started = time.monotonic()
    cluster: KafkaCluster | None = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        cluster = KafkaCluster(KafkaOptions(brokers=1)).start()
        bootstrap = cluster.bootstrap
        print(f"kafka started in {time.monotonic() - started:.1f}s at {bootstrap}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
            run(bootstrap, profile, Path(tmp))
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
