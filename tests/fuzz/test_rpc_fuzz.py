"""Fuzz every RPC of every service on a live mesh (issue 18, item 10).

A real assigner, two real sidecars and a real notifier run on the session's Kafka. Every
RPC the generated code declares (enumerated from the ``*_pb2`` descriptors, so a new RPC
is fuzzed without a change here) gets Hypothesis-generated requests from
``tests.support.proto_strategies``: unary calls one request, server-streaming calls read
what comes back until a short deadline, client/bidi-streaming calls send a bounded
generated sequence. Pass: no call answers ``INTERNAL`` or ``UNKNOWN`` (bad input gets a
clear status), every service is SERVING on gRPC health and ``/healthz`` afterwards, and a
``DsClient`` counting records of its own group beside the fuzzer receives every record
produced meanwhile, none twice.

Keeping the counted client's group out of the fuzzer's way: the fuzzer calls AdminService
mutations (UpdateGroup, ResetOffsets, MoveLease, DrainSidecar ...), ``Leave``, ``Session``
joins and ``Unbind``, which would legitimately disrupt the group they name. So every group
name, sidecar id, client id and topic the fuzzer sends is drawn from a pool that names the
*scratch* group, its sidecar and topic (so the calls reach deep into the servicers) plus
arbitrary text, and never the counted group, its sidecar, its client or its topic.
StreamService calls go to the scratch sidecar.

Profiles: ``test_fuzz_every_rpc`` (CI) runs ``DS_FUZZ_EXAMPLES`` (default 500) examples
per RPC; ``test_fuzz_every_rpc_long`` (marker ``long``: ``make test-long``, not CI) runs
10,000. Each prints per RPC the examples run and the status codes seen (run with ``-s``).
``DS_FUZZ_SHARD=i/n`` fuzzes only every n-th RPC from the i-th (1-based), so the long
profile can run as n pytest processes side by side, each on its own stack;
``DS_FUZZ_RPCS=REGEX`` only the RPCs whose full name it matches (a profile run in pieces).
Each RPC's line is printed as soon as it is done, so a run stopped early still reports
the RPCs it finished.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka import Producer
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsclient import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.proto_strategies import message_strategy, methods, text_values

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CI_EXAMPLES = int(os.environ.get("DS_FUZZ_EXAMPLES", "500"))
LONG_EXAMPLES = 10_000
SHARD = os.environ.get("DS_FUZZ_SHARD", "1/1")
RPCS = os.environ.get("DS_FUZZ_RPCS", "")
UNARY_DEADLINE = 2.0  # a long-poll Fetch with a generated max_wait ends here
STREAM_DEADLINE = 0.2  # how long a streaming call is read before the fuzzer moves on
MAX_STREAM_REQUESTS = 5
MAX_STREAM_RESPONSES = 20
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
PARTITIONS = 4
PRODUCE_EVERY = 0.05  # the counted topic gets ~10 records per 50 ms during the run
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 8 << 20),
    ("grpc.max_receive_message_length", 8 << 20),
]


@dataclass
class Stack:
    assigner: ServiceProcess
    notifier: ServiceProcess
    counted_sidecar: ServiceProcess
    scratch_sidecar: ServiceProcess
    counted_group: str
    counted_topic: str
    scratch_group: str
    scratch_topic: str
    bootstrap: str
    counted_client_id: str = "fuzz-counted-client"

    def target(self, service: str) -> ServiceProcess:
        """The process that serves ``service``; a service not listed here fails the test
        (a new service needs a process to fuzz, not silence)."""
        targets = {
            "dataservice.assigner.v1.AssignerService": self.assigner,
            "dataservice.assigner.v1.BindingService": self.assigner,
            "dataservice.assigner.v1.AdminService": self.assigner,
            "dataservice.sidecar.v1.StreamService": self.scratch_sidecar,
            "dataservice.notifier.v1.NotifierService": self.notifier,
        }
        assert service in targets, f"no process to fuzz {service} against"
        return targets[service]

    def services(self) -> list[ServiceProcess]:
        return [self.assigner, self.notifier, self.counted_sidecar, self.scratch_sidecar]


@pytest.fixture
def stack(
    kafka_cluster: KafkaHandle, topic_factory: TopicFactory, tmp_path: Path
) -> Iterator[Stack]:
    counted_topic = topic_factory(partitions=PARTITIONS)
    scratch_topic = topic_factory(partitions=PARTITIONS)
    counted, scratch = f"counted-{counted_topic}", f"scratch-{scratch_topic}"
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as mesh:
        assigner = mesh.assigner([(counted, [counted_topic]), (scratch, [scratch_topic])])
        notifier = mesh.service("notifier")
        assigner.wait_serving()
        counted_sidecar = mesh.sidecar(counted, assigner, "fuzz-counted-sidecar")
        scratch_sidecar = mesh.sidecar(scratch, assigner, "fuzz-scratch-sidecar")
        for svc in (notifier, counted_sidecar, scratch_sidecar):
            svc.wait_serving(90)
        yield Stack(
            assigner, notifier, counted_sidecar, scratch_sidecar,
            counted, counted_topic, scratch, scratch_topic, kafka_cluster.bootstrap,
        )  # fmt: skip


def _names(pool: list[str], protected: set[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(pool), text_values()).filter(lambda s: s not in protected)


def name_overrides(stack: Stack, roots: list[Descriptor]) -> dict[str, st.SearchStrategy[str]]:
    """Overrides for every string field (by full name) reachable from ``roots`` that names
    a group, a sidecar, a client or a topic: the scratch ones or arbitrary text, never the
    counted client's (see the module docstring)."""
    protected = {
        stack.counted_group, stack.counted_topic, stack.counted_client_id,
        stack.counted_sidecar.args[stack.counted_sidecar.args.index("--id") + 1],
    }  # fmt: skip
    groups = _names([stack.scratch_group, "fuzz-new-group"], protected)
    sidecars = _names(["fuzz-scratch-sidecar", "fuzz-other-sidecar"], protected)
    clients = _names(["fuzz-client"], protected)
    topics = _names([stack.scratch_topic, "ds.alerts.fuzz"], protected)
    by_name = {
        "group": groups, "groups": groups,
        "sidecar_id": sidecars, "target_sidecar_id": sidecars, "holder": sidecars,
        "client_id": clients, "consumer_id": clients,
        "topic": topics, "topics": topics,
    }  # fmt: skip
    overrides: dict[str, st.SearchStrategy[str]] = {
        "dataservice.assigner.v1.GroupConfig.name": groups
    }
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        descriptor = todo.pop()
        if descriptor.full_name in seen:
            continue
        seen.add(descriptor.full_name)
        for f in descriptor.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                todo.append(f.message_type)
            elif f.type == FieldDescriptor.TYPE_STRING and f.name in by_name:
                overrides[f.full_name] = by_name[f.name]
    return overrides


def request_strategy(
    method: MethodDescriptor, overrides: dict[str, st.SearchStrategy[str]]
) -> st.SearchStrategy[Any]:
    one = message_strategy(method.input_type, overrides)
    if method.client_streaming:
        return st.lists(one, max_size=MAX_STREAM_REQUESTS)
    return one


def serialize(message: Message) -> bytes:
    return message.SerializeToString()


def call(channel: grpc.Channel, method: MethodDescriptor, request: Any) -> grpc.StatusCode:
    """Make one call as its kind says; the status it ended with (OK, or the fuzzer's own
    CANCELLED after reading enough of a stream)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    response_type = message_factory.GetMessageClass(method.output_type)
    kwargs = {
        "request_serializer": serialize,
        "response_deserializer": response_type.FromString,
    }
    try:
        if not method.server_streaming:
            if method.client_streaming:
                channel.stream_unary(path, **kwargs)(iter(request), timeout=UNARY_DEADLINE)
            else:
                channel.unary_unary(path, **kwargs)(request, timeout=UNARY_DEADLINE)
            return grpc.StatusCode.OK
        if method.client_streaming:
            responses = channel.stream_stream(path, **kwargs)(
                iter(request), timeout=STREAM_DEADLINE
            )
        else:
            responses = channel.unary_stream(path, **kwargs)(request, timeout=STREAM_DEADLINE)
        for count, _ in enumerate(responses, 1):
            if count >= MAX_STREAM_RESPONSES:
                responses.cancel()
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return,attr-defined]


def short(request: Any, limit: int = 600) -> str:
    text = repr(request)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class RpcResult:
    examples: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    failure: str | None = None


def fuzz_rpc(
    channel: grpc.Channel, method: MethodDescriptor, strategy: st.SearchStrategy[Any], n: int
) -> RpcResult:
    result = RpcResult()

    # The CI profile is derandomized (the same examples every run: a red CI is a
    # reproducible finding, not luck); the long profile explores at random.
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=n <= CI_EXAMPLES,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(request: Any) -> None:
        code = call(channel, method, request)
        result.examples += 1
        result.statuses[code.name] += 1
        assert code not in BAD, f"{method.full_name} answered {code.name} to {short(request)}"

    if not method.input_type.fields and not method.client_streaming:
        # An empty request has one value: Hypothesis would stop after one example, so
        # the call is repeated to put the same load on it as on the others.
        for _ in range(n - 1):
            code = call(channel, method, message_factory.GetMessageClass(method.input_type)())
            result.examples += 1
            result.statuses[code.name] += 1
    try:
        run()
    except AssertionError as err:
        result.failure = str(err)
    return result


@dataclass
class CountedClient:
    """Produces keyed records to the counted topic and reads them back with a DsClient
    in the counted group, acking each batch: every key must arrive, none twice."""

    bootstrap: str
    topic: str
    group: str
    assigner: str
    client_id: str
    produced: int = 0
    received: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_reading: threading.Event = field(default_factory=threading.Event)

    def produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        while not self.stop_producing.is_set():
            for _ in range(10):
                key = self.produced
                producer.produce(self.topic, key=str(key).encode(), partition=key % PARTITIONS)
                self.produced += 1
            producer.poll(0)
            time.sleep(PRODUCE_EVERY)
        if producer.flush(30) != 0:
            self.errors.append("producer could not flush")

    def read(self) -> None:
        try:
            with DsClient(self.group, client_id=self.client_id, assigner=self.assigner) as client:
                while not self.stop_reading.is_set():
                    batch = client.fetch(max_records=500, max_wait=0.5)
                    for record in batch:
                        self.received[int(record.key.decode())] += 1
                    if batch:
                        client.ack(batch)
        except Exception as err:  # reported by the test, not lost in a thread
            self.errors.append(repr(err))

    @contextlib.contextmanager
    def running(self) -> Iterator[CountedClient]:
        threads = [threading.Thread(target=t, daemon=True) for t in (self.produce, self.read)]
        for t in threads:
            t.start()
        try:
            yield self
        finally:
            self.stop_producing.set()
            threads[0].join(60)
            deadline = time.monotonic() + 90
            while len(self.received) < self.produced and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(2)  # a duplicate delivered late would show up here
            self.stop_reading.set()
            threads[1].join(60)


def wait_healthy(svc: ServiceProcess, timeout: float = 60) -> tuple[str | None, int | None]:
    deadline = time.monotonic() + timeout
    while True:
        state = (svc.grpc_health(), svc.healthz())
        if state == ("SERVING", 200) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def shard_of(rpcs: list[MethodDescriptor], shard: str) -> list[MethodDescriptor]:
    """The RPCs shard ``i/n`` fuzzes: every n-th from the i-th (1-based)."""
    index, _, count = shard.partition("/")
    i, n = int(index), int(count)
    if not 1 <= i <= n:
        raise ValueError(f"DS_FUZZ_SHARD={shard!r}: want i/n with 1 <= i <= n")
    return rpcs[i - 1 :: n]


def rpc_line(name: str, result: RpcResult) -> str:
    """``name: N examples in S s: STATUS n, ...`` (and its failure, if any)."""
    statuses = ", ".join(
        f"{code} {n}" for code, n in result.statuses.most_common() if code != "_seconds"
    )
    failed = f"; FAILED: {result.failure}" if result.failure else ""
    return (
        f"{name}: {result.examples} examples in {result.statuses['_seconds']} s: {statuses}{failed}"
    )


def fuzz_everything(stack: Stack, examples: int) -> None:
    rpcs = [m for m in shard_of(methods(), SHARD) if re.search(RPCS, m.full_name)]
    assert rpcs, f"no RPC matches DS_FUZZ_RPCS={RPCS!r} in shard {SHARD}"
    overrides = name_overrides(stack, [m.input_type for m in rpcs])
    strategies = {m.full_name: request_strategy(m, overrides) for m in rpcs}
    results: dict[str, RpcResult] = {}
    counted = CountedClient(
        stack.bootstrap,
        stack.counted_topic, stack.counted_group, stack.assigner.grpc_addr,
        stack.counted_client_id,
    )  # fmt: skip
    started = time.monotonic()
    with counted.running():
        channels = {
            svc.grpc_addr: grpc.insecure_channel(svc.grpc_addr, CHANNEL_OPTIONS)
            for svc in stack.services()
        }
        try:
            for method in rpcs:
                channel = channels[stack.target(method.containing_service.full_name).grpc_addr]
                began = time.monotonic()
                results[method.full_name] = fuzz_rpc(
                    channel, method, strategies[method.full_name], examples
                )
                results[method.full_name].statuses["_seconds"] = round(time.monotonic() - began)
                line = rpc_line(method.full_name, results[method.full_name])
                print(f"\n  done: {line}", flush=True)
        finally:
            for channel in channels.values():
                channel.close()
    elapsed = time.monotonic() - started

    print(
        f"\nfuzzed {len(rpcs)} RPCs (shard {SHARD}), {examples} examples each asked, "
        f"in {elapsed:.0f} s"
    )
    for name, result in results.items():
        print(f"  {rpc_line(name, result)}")
    health = {svc.log.stem: wait_healthy(svc) for svc in stack.services()}
    print(f"health after the run: {health}")
    duplicates = sum(n - 1 for n in counted.received.values() if n > 1)
    missing = sorted(set(range(counted.produced)) - set(counted.received))
    print(
        f"counted client: produced {counted.produced}, received {len(counted.received)} "
        f"distinct, {duplicates} duplicates, {len(missing)} missing, errors {counted.errors}"
    )

    failures = {name: r.failure for name, r in results.items() if r.failure}
    assert not failures, "\n".join(failures.values())
    assert all(state == ("SERVING", 200) for state in health.values()), health
    assert not counted.errors
    assert counted.produced > 0
    assert not missing, f"records lost: {missing[:20]}"
    # Nothing the fuzzer sends touches the counted group, so nothing is redelivered.
    assert duplicates == 0
    assert all(r.examples >= min(examples, 2) for r in results.values())


@pytest.mark.timeout(1200)
def test_fuzz_every_rpc(stack: Stack) -> None:
    fuzz_everything(stack, CI_EXAMPLES)


@pytest.mark.long
@pytest.mark.timeout(6 * 3600)
def test_fuzz_every_rpc_long(stack: Stack) -> None:
    fuzz_everything(stack, LONG_EXAMPLES)
