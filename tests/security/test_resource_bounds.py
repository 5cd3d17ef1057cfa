"""Bounded-resource suite (issue 37, finding 11): what callers that misbehave on purpose
(or crash by the thousand) can hold on a secured mesh, in figures: idle sockets, huge
messages before authentication, Health.Watch streams that are never read, a Stream whose
client sends without reading, 2,000 raw Bind calls abandoned. Each test prints the peak
RSS (VmHWM) and the threads of the process under attack before and after, and the queue or
count that the bound holds; and shows the mesh's other callers keep flowing meanwhile.

The mesh is secured as ``dsctl dev up --secure`` secures it (``service_env``), with real
assigner and sidecar processes on the shared broker and a state topic of its own; the
assigner's binding liveness is 5 s so abandoned bindings expire within the test.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, binding_pb2, binding_pb2_grpc
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.connection import ConnectionSettings, TlsConfig, open_channel
from dsclient.reasons import error_info
from services.consumer_sidecar.stream_flow import MAX_STREAM_RESULTS
from services.devstack.kafka import KafkaHandle, create_topic, delete_topic
from services.devstack.pki import DevPki, make_dev_pki
from services.devstack.secure import service_env
from services.runtime.grpcserver import MAX_HEALTH_WATCHERS
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.readers import READERS
from tests.support.sidecar_probe import produce_bulk

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 2
RECORDS = 40
CLIENT = "client"
SIDECAR = "bound-sidecar"
NO_RETRY = ConnectionSettings(retry=None)
MIB = 1024 * 1024
LIVENESS_SECONDS = 5
HUGE_REQUESTS = 20


@dataclass
class Mesh:
    pki: DevPki
    group: str
    other: str
    assigner: ServiceProcess
    sidecar: ServiceProcess
    topic: str

    def channel(self, target: str, token: str) -> grpc.Channel:
        """To ``target`` with ``token``'s token for it (each service accepts its own
        audience only: the sidecar token to the sidecar, the control plane's elsewhere)."""
        to_sidecar = target == self.sidecar.grpc_addr
        tls = TlsConfig(
            ca_file=self.pki.ca,
            cert_file=self.pki.cert(CLIENT),
            key_file=self.pki.key(CLIENT),
            token_file=self.pki.sidecar_token(token) if to_sidecar else self.pki.token(token),
        )
        return open_channel(target, NO_RETRY.with_tls(tls))


@pytest.fixture(scope="module")
def mesh(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    run = uuid.uuid4().hex[:6]
    group, other, topic = f"g-bound-{run}", f"g-bound-other-{run}", f"bound-{run}"
    roles: dict[str, list[str]] = {
        "assigner": ["reporter"],
        SIDECAR: ["sidecar", f"serves:{group}", "reporter"],
        "crasher": [f"reader:{group}"],
        "reader": [f"reader:{group}", f"reader:{other}"],
        "viewer": ["viewer"],
    }
    root = tmp_path_factory.mktemp("bounds")
    pki = make_dev_pki(root / "pki", roles, certificates=["assigner", SIDECAR, CLIENT])
    create_topic(kafka_cluster.bootstrap, topic, PARTITIONS)
    try:
        produce_bulk(kafka_cluster.bootstrap, topic, RECORDS, 10, PARTITIONS)
        with running_mesh(kafka_cluster.bootstrap, root) as services:
            env = {
                **service_env(pki, "assigner"),
                "DS_STATE_TOPIC": f"__ds_bound_state_{run}",
                # and a transactional id of its own: another assigner on the shared broker
                # with the default one fences this one's state writes (it stops leading)
                "DS_STATE_TRANSACTIONAL_ID": f"ds-bound-state-{run}",
                "DS_BINDING_LIVENESS_SECONDS": str(LIVENESS_SECONDS),
            }
            assigner = services.assigner([(group, [topic]), (other, [topic])], env=env)
            assigner.wait_serving()
            sidecar = services.sidecar(
                group, assigner, SIDECAR, env=dict(service_env(pki, SIDECAR))
            )
            sidecar.wait_serving()
            yield Mesh(pki, group, other, assigner, sidecar, topic)
    finally:
        delete_topic(kafka_cluster.bootstrap, topic)
        delete_topic(kafka_cluster.bootstrap, f"__ds_bound_state_{run}")


@dataclass(frozen=True)
class Usage:
    peak_rss_mib: float  # VmHWM: the most the process ever held
    threads: int

    def __str__(self) -> str:
        return f"peak RSS {self.peak_rss_mib:.1f} MiB, {self.threads} threads"


def usage(process: ServiceProcess) -> Usage:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
    )
    return Usage(int(fields["VmHWM"].split()[0]) / 1024, int(fields["Threads"]))


def bound(attack: str, before: Usage, after: Usage, held: str) -> None:
    print(f"\nBOUND {attack}\n  before: {before}\n  after:  {after}\n  held:   {held}")


def binds(mesh: Mesh, token: str, client_id: str, group: str) -> str:
    """A raw Bind's outcome: "bound" or the refusal's code and reason."""
    with mesh.channel(mesh.assigner.grpc_addr, token) as channel:
        try:
            binding_pb2_grpc.BindingServiceStub(channel).Bind(
                binding_pb2.BindRequest(client_id=client_id, group=group), timeout=10
            )
            return "bound"
        except grpc.RpcError as err:
            info = error_info(err)
            return f"{err.code().name} {info.reason if info else ''}"


def bindings(mesh: Mesh) -> int:
    """The group's bindings as DescribeGroup shows them to a viewer. On a loaded machine
    the lone assigner may lose its term for a moment (NOT_LEADER): asked again then."""
    deadline = time.monotonic() + 30
    with mesh.channel(mesh.assigner.grpc_addr, "viewer") as channel:
        while True:
            try:
                described = admin_pb2_grpc.AdminServiceStub(channel).DescribeGroup(
                    admin_pb2.DescribeGroupRequest(group=mesh.group), timeout=10
                )
                return len(described.bindings)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                if time.monotonic() > deadline:
                    raise
                print(f"  (DescribeGroup: {err.details()}; asked again)")
                time.sleep(0.5)


def flows(mesh: Mesh, client_id: str) -> int:
    """Records a Fetch of the group's other reader gets within 30 s (0: none)."""
    deadline = time.monotonic() + 30
    with mesh.channel(mesh.sidecar.grpc_addr, "reader") as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        while time.monotonic() < deadline:
            request = stream_pb2.FetchRequest(client_id=client_id, group=mesh.group, max_records=5)
            try:
                records = list(stub.Fetch(request, timeout=10).records)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
                records = []
            if records:
                return len(records)
            time.sleep(0.2)
    return 0


def test_idle_sockets_and_huge_messages_before_authentication(mesh: Mesh) -> None:
    """300 idle TCP sockets on the assigner's HTTP port and 300 on its gRPC port, then
    HUGE_REQUESTS 17 MiB requests from a caller with no token: threads stay within the HTTP
    cap (64) of where they were, the huge requests are refused undecoded, and the peak RSS
    stops growing: the refused requests are not kept."""
    before = usage(mesh.assigner)
    http = ("127.0.0.1", mesh.assigner.http_port)
    grpc_port = ("127.0.0.1", mesh.assigner.grpc_port)
    with ExitStack() as stack:
        for address in [http] * 300 + [grpc_port] * 300:
            stack.enter_context(socket.create_connection(address, timeout=5))
        time.sleep(1)  # the server has accepted them all
        during = usage(mesh.assigner)
        codes = []
        tls = TlsConfig(ca_file=mesh.pki.ca, cert_file=mesh.pki.cert(CLIENT),
                        key_file=mesh.pki.key(CLIENT))  # fmt: skip
        options = NO_RETRY.with_tls(tls)
        peaks: dict[int, float] = {}
        with open_channel(mesh.assigner.grpc_addr, options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for sent in range(1, HUGE_REQUESTS + 1):
                try:
                    stub.Check(health_pb2.HealthCheckRequest(service="x" * (17 * MIB)), timeout=20)
                    codes.append("OK")
                except grpc.RpcError as err:
                    codes.append(err.code().name)
                if sent in (2, HUGE_REQUESTS // 2, HUGE_REQUESTS):
                    peaks[sent] = usage(mesh.assigner).peak_rss_mib
        after = usage(mesh.assigner)
    by_count = {n: round(mib) for n, mib in peaks.items()}
    bound(f"600 idle sockets, {HUGE_REQUESTS} 17 MiB requests before auth", before, after,
          f"threads while idle sockets open: {during.threads}; answers {set(codes)}; "
          f"peak RSS (MiB) after N requests {by_count}")  # fmt: skip
    assert set(codes) == {"RESOURCE_EXHAUSTED"}
    # The HTTP server's cap (64) plus gRPC core's own: its EventEngine pool adds a few
    # workers under a burst of 300 accepts (4 to 5 seen; 106 against a bound of 105 failed
    # a run on 2 Dec), bounded by the pool, not by the sockets.
    assert during.threads <= before.threads + 64 + 8
    # gRPC's transport holds a refused request's frames while it drains them, and on a
    # loaded machine the next request's frames arrive before the last ones are freed: the
    # peak grows by a few messages' worth however many are sent (20-50 MiB after the first
    # two on a quiet machine, 74 in a CI run on 3 Dec), which with ten requests crossed a
    # bound of half their bytes. Not kept is what matters: after the first two, the rest
    # (306 MiB together) raise the peak by less than half of their bytes.
    kept_if_leaked = (HUGE_REQUESTS - 2) * 17
    assert after.peak_rss_mib - peaks[2] < kept_if_leaked / 2
    assert flows(mesh, "idle-witness") > 0


def test_health_watch_streams_never_read(mesh: Mesh) -> None:
    """Twice the cap of Health.Watch streams opened on the sidecar and never read: the cap
    is served, the rest refused TOO_MANY_WATCHERS, threads and memory unchanged, and the
    group's reader still fetches."""
    before = usage(mesh.sidecar)
    tls = TlsConfig(ca_file=mesh.pki.ca, cert_file=mesh.pki.cert(CLIENT),
                    key_file=mesh.pki.key(CLIENT))  # fmt: skip
    outcomes: dict[str, int] = {}
    with open_channel(mesh.sidecar.grpc_addr, NO_RETRY.with_tls(tls)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        calls = [
            stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            for _ in range(2 * MAX_HEALTH_WATCHERS)
        ]
        for call in calls:
            try:
                next(call)
                outcome = "served"
            except grpc.RpcError as err:
                info = error_info(err)
                outcome = f"{err.code().name} {info.reason if info else ''}"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        after = usage(mesh.sidecar)
        flowing = flows(mesh, "watch-witness")
        for call in calls:
            call.cancel()
    bound(f"{2 * MAX_HEALTH_WATCHERS} Health.Watch streams never read", before, after,
          f"outcomes {outcomes}; the group's reader got {flowing} records")  # fmt: skip
    assert outcomes == {
        "served": MAX_HEALTH_WATCHERS,
        "RESOURCE_EXHAUSTED TOO_MANY_WATCHERS": MAX_HEALTH_WATCHERS,
    }
    assert after.threads <= before.threads + 2 and flowing > 0


def test_a_stream_client_that_sends_without_reading(mesh: Mesh) -> None:
    """A Stream client sends 20,000 nacks of 200 ranges each (about 90 MiB, and as much in
    answers, each echoing the ranges it refuses) and reads nothing: the sidecar stops reading
    it at MAX_STREAM_RESULTS answers waiting, so the client's sends stop on flow control;
    the sidecar's RSS and threads stay put and another reader fetches."""
    before = usage(mesh.sidecar)
    sent = 0
    ranges = [
        stream_pb2.RangeAck(topic="t", partition=0, from_offset=i, to_offset=i + 1)
        for i in range(200)
    ]
    nacks = stream_pb2.StreamRequest(nacks=stream_pb2.StreamNacks(ranges=ranges))

    def requests() -> Iterator[stream_pb2.StreamRequest]:
        nonlocal sent
        yield stream_pb2.StreamRequest(
            open=stream_pb2.StreamOpen(client_id="never-reads", group=mesh.group)
        )
        for _ in range(20_000):
            sent += 1
            yield nacks

    with mesh.channel(mesh.sidecar.grpc_addr, "crasher") as channel:
        call = stream_pb2_grpc.StreamServiceStub(channel).Stream(requests(), timeout=120)
        time.sleep(5)  # the sidecar reads what it will read; nothing is read here
        after = usage(mesh.sidecar)
        flowing = flows(mesh, "stream-witness")
        taken = sent
        call.cancel()  # type: ignore[no-untyped-call]
    bound("a Stream client sending 20,000 nacks, reading none", before, after,
          f"{taken} of 20,000 nacks left the client (the rest wait on flow control; "
          f"the sidecar holds at most {MAX_STREAM_RESULTS} answers); "
          f"the group's reader got {flowing} records")  # fmt: skip
    assert taken < 20_000
    assert after.peak_rss_mib - before.peak_rss_mib < 64
    assert after.threads <= before.threads + 2 and flowing > 0


def test_two_thousand_abandoned_binds(mesh: Mesh) -> None:
    """2,000 raw Bind calls, each a new client id never seen again (a crash-looping
    Deployment): the assigner's threads and memory stay put, every binding expires within
    the liveness window, and a new client of the group binds; the other group binds all
    along."""
    before = usage(mesh.assigner)
    outcomes: dict[str, int] = {}
    with mesh.channel(mesh.assigner.grpc_addr, "crasher") as channel:
        stub = binding_pb2_grpc.BindingServiceStub(channel)
        for i in range(2000):
            try:
                stub.Bind(binding_pb2.BindRequest(client_id=f"crashed-{i}", group=mesh.group),
                          timeout=10)  # fmt: skip
                outcome = "bound"
            except grpc.RpcError as err:
                info = error_info(err)
                outcome = f"{err.code().name} {info.reason if info else ''}"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    other = binds(mesh, "reader", "other-live", mesh.other)
    after = usage(mesh.assigner)
    held = bindings(mesh)
    deadline = time.monotonic() + LIVENESS_SECONDS * 6
    while (left := bindings(mesh)) and time.monotonic() < deadline:
        time.sleep(0.5)
    fresh = binds(mesh, "reader", "fresh-client", mesh.group)
    expired = binds(mesh, "crasher", "crashed-0", mesh.group)  # binds again: a new binding
    bound("2,000 raw Bind calls abandoned", before, after,
          f"outcomes {outcomes}; bindings held {held}, after the {LIVENESS_SECONDS} s "
          f"window {left}; other group: {other}; a new client: {fresh}, an abandoned id "
          f"again: {expired}")  # fmt: skip
    # (the first bindings may have expired already while the last were made)
    assert outcomes == {"bound": 2000} and held > 0 and left == 0
    assert other == "bound" and fresh == "bound" and expired == "bound"
    assert after.threads <= before.threads + 2
    assert after.peak_rss_mib - before.peak_rss_mib < 64


CRASHED_CLIENTS = 50


def _dsread(
    mesh: Mesh, client_id: str, token: str, mode: str, log: Path
) -> subprocess.Popen[bytes]:
    """A real client (the Go dsread) of the group on the secured mesh, printing a ``rec``
    line per record it received, then acking the batch; exits after 20 s without one."""
    pki = mesh.pki
    argv = READERS["go"].command(
        "--assigner", mesh.assigner.grpc_addr, "--group", mesh.group, "--client-id", client_id,
        "--expect", str(10**9), "--mode", mode, "--idle-exit-s", "20",
        "--ca", str(pki.ca), "--cert", str(pki.cert(CLIENT)), "--key", str(pki.key(CLIENT)),
        "--token-file", str(pki.token(token)),
        "--sidecar-token-file", str(pki.sidecar_token(token)),
    )  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _printed(log: Path) -> set[tuple[int, int]]:
    """(partition, offset) of every ``rec`` line a dsread printed."""
    seen: set[tuple[int, int]] = set()
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "rec":
            seen.add((int(parts[2]), int(parts[3])))
    return seen


def _high_watermarks(mesh: Mesh) -> dict[int, int]:
    with mesh.channel(mesh.sidecar.grpc_addr, "reader") as channel:
        status = stream_pb2_grpc.StreamServiceStub(channel).Status(
            stream_pb2.StatusRequest(), timeout=10
        )
    return {p.partition: p.high_watermark for p in status.partitions}


@pytest.mark.long
def test_fifty_real_clients_killed(mesh: Mesh, kafka_cluster: KafkaHandle, tmp_path: Path) -> None:
    """50 real clients (Go dsread, streaming) killed with kill -9 while they read: every
    binding is gone within the liveness window, a new client binds, and the group's other
    client lost nothing: every record produced during the test was printed (and so acked
    or given back) by a killed client before its death, or by the survivor."""
    start = _high_watermarks(mesh)
    logs = tmp_path
    survivor = _dsread(mesh, "survivor", "reader", "fetch", logs / "survivor.log")
    crashers = [
        _dsread(mesh, f"crash-{i}", "crasher", "stream", logs / f"crash-{i}.log")
        for i in range(CRASHED_CLIENTS)
    ]
    try:
        deadline = time.monotonic() + 60
        while (held := bindings(mesh)) < CRASHED_CLIENTS + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        produce_bulk(kafka_cluster.bootstrap, mesh.topic, 2000, 10, PARTITIONS)
        time.sleep(3)  # the crashers read a share of them
        killed_at = time.monotonic()
        for crasher in crashers:
            crasher.kill()  # SIGKILL
        for crasher in crashers:
            crasher.wait(timeout=30)
        while (left := bindings(mesh)) > 1 and time.monotonic() < killed_at + LIVENESS_SECONDS * 6:
            time.sleep(0.25)
        gone_after = time.monotonic() - killed_at
        fresh = binds(mesh, "crasher", "after-the-kill", mesh.group)
        survivor.wait(timeout=240)  # it exits 20 s after its last record
    finally:
        for process in (survivor, *crashers):
            if process.poll() is None:
                process.kill()
    end = _high_watermarks(mesh)
    # (a high watermark the sidecar does not know yet is -1: from 0 then)
    produced = {(p, o) for p in end for o in range(max(0, start.get(p, 0)), end[p])}
    by_crashers: set[tuple[int, int]] = set()
    for i in range(CRASHED_CLIENTS):
        by_crashers |= _printed(logs / f"crash-{i}.log")
    by_survivor = _printed(logs / "survivor.log")
    lost = produced - by_crashers - by_survivor
    print(
        f"\nBOUND {CRASHED_CLIENTS} real clients (Go dsread, Stream) killed with kill -9\n"
        f"  bindings held {held}; after the kill {left} left (the survivor's) in "
        f"{gone_after:.1f} s (liveness window {LIVENESS_SECONDS} s); a new client: {fresh}\n"
        f"  of {len(produced)} records, the killed clients printed "
        f"{len(produced & by_crashers)} (acked or given back), the survivor "
        f"{len(produced & by_survivor)}; lost {len(lost)}"
    )
    assert held >= CRASHED_CLIENTS + 1
    assert left <= 1 and fresh == "bound"
    assert produced and not lost, sorted(lost)[:10]
