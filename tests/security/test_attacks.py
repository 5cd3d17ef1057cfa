"""Adversarial suite (issue 37): each test tries one attack on a secured mesh, prints what
it tried and what it got, and holds the mesh to its rule: a stolen sidecar or reader
credential yields at most its own groups' records; only admin moves offsets, leases or
config; nothing an unknown caller sends is decoded past the bounds.

The mesh is secured as ``dsctl dev up --secure`` secures it (``services.devstack.secure``'s
``service_env``: TLS and mTLS on every port, a bearer token per caller, authorization on),
with real processes of the assigner and a sidecar on the shared Kafka broker; the policy
gives each identity what its role in the attack needs and nothing more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataservice.assigner.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    assigner_pb2,
    assigner_pb2_grpc,
    binding_pb2,
    binding_pb2_grpc,
)
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.connection import ConnectionSettings, TlsConfig, open_channel
from dsclient.reasons import error_info
from services.devstack.kafka import KafkaHandle, create_topic, delete_topic
from services.devstack.pki import DevPki, make_dev_pki
from services.devstack.secure import service_env
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.sidecar_probe import produce_bulk

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 2
RECORDS = 40  # 20 a partition
CLIENT = "client"  # the callers' certificate; the token says who calls
SIDECAR = "sec-sidecar"
NO_RETRY = ConnectionSettings(retry=None)


@dataclass
class Secured:
    pki: DevPki
    group: str
    other: str
    topic: str
    assigner: ServiceProcess
    sidecar: ServiceProcess
    notifier: ServiceProcess

    def channel(
        self, target: str, token: str | None, token_file: Path | None = None
    ) -> grpc.Channel:
        """A channel to ``target`` sending ``token``'s token for that service (the sidecar
        token to the sidecar, the control plane's to the others), or ``token_file``."""
        if token_file is None and token:
            to_sidecar = target == self.sidecar.grpc_addr
            token_file = self.pki.sidecar_token(token) if to_sidecar else self.pki.token(token)
        tls = TlsConfig(
            ca_file=self.pki.ca,
            cert_file=self.pki.cert(CLIENT),
            key_file=self.pki.key(CLIENT),
            token_file=token_file,
        )
        return open_channel(target, NO_RETRY.with_tls(tls))


@pytest.fixture(scope="module")
def mesh(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    run = uuid.uuid4().hex[:6]
    group, other, topic = f"g-sec-{run}", f"g-sec-other-{run}", f"sec-{run}"
    roles: dict[str, list[str]] = {
        "assigner": ["reporter"],
        SIDECAR: ["sidecar", f"serves:{group}", "reporter"],
        # A stolen sidecar credential of the group, and one the policy also lets name the
        # live sidecar's id (a misconfiguration or a stolen role).
        "stolen-sidecar": ["sidecar", f"serves:{group}"],
        "thief": [f"sidecar:{SIDECAR}", f"serves:{group}"],
        "reader-a": [f"reader:{group}"],
        "reader-b": [f"reader:{group}"],
        "viewer": ["viewer"],
        "notifier": [],
    }
    root = tmp_path_factory.mktemp("security")
    pki = make_dev_pki(
        root / "pki",
        roles,
        certificates=["assigner", "notifier", SIDECAR, CLIENT, "stolen-sidecar"],
    )
    create_topic(kafka_cluster.bootstrap, topic, PARTITIONS)
    try:
        produce_bulk(kafka_cluster.bootstrap, topic, RECORDS, 10, PARTITIONS)
        with running_mesh(kafka_cluster.bootstrap, root) as services:
            # A state topic of its own: no other assigner on the shared broker contends
            # for its term or restores its groups.
            # ... and a transactional id of its own: another assigner on the shared broker
            # with the default one fences this one's state writes (it stops leading).
            env = {
                **service_env(pki, "assigner"),
                "DS_STATE_TOPIC": f"__ds_sec_state_{run}",
                "DS_STATE_TRANSACTIONAL_ID": f"ds-sec-state-{run}",
            }
            assigner = services.assigner([(group, [topic]), (other, [topic])], env=env)
            assigner.wait_serving()
            sidecar = services.sidecar(
                group, assigner, SIDECAR, env=dict(service_env(pki, SIDECAR))
            )
            sidecar.wait_serving()
            notifier_env = {
                **service_env(pki, "notifier"),
                "DS_FAULTS_TOPIC": f"__ds_sec_faults_{run}",
            }
            notifier = services.service("notifier", env=notifier_env)
            notifier.wait_serving()
            yield Secured(pki, group, other, topic, assigner, sidecar, notifier)
    finally:
        delete_topic(kafka_cluster.bootstrap, topic)
        delete_topic(kafka_cluster.bootstrap, f"__ds_sec_state_{run}")
        delete_topic(kafka_cluster.bootstrap, f"__ds_sec_faults_{run}")


def refusal(err: grpc.RpcError) -> tuple[str, str, dict[str, str]]:
    info = error_info(err)
    return (
        err.code().name,  # type: ignore[attr-defined]
        info.reason if info else "",
        dict(info.metadata) if info else {},
    )


def session(mesh: Secured, token: str, sidecar_id: str, group: str, endpoint: str) -> Any:
    """The first answer of a Session opened as ``token``: "accepted", or the refusal."""
    join = assigner_pb2.SessionRequest(
        join=assigner_pb2.SessionJoin(sidecar_id=sidecar_id, group=group, endpoint=endpoint)
    )
    with mesh.channel(mesh.assigner.grpc_addr, token) as channel:
        try:
            for response in assigner_pb2_grpc.AssignerServiceStub(channel).Session(
                iter([join]), timeout=10
            ):
                return response.WhichOneof("kind")
            return "ended"
        except grpc.RpcError as err:
            return refusal(err)


def report(attack: str, got: object) -> None:
    print(f"\nATTACK {attack}\n  got: {got}")


def fetched(mesh: Secured, token: str, client_id: str) -> list[Any]:
    """Records a Fetch as ``token`` and ``client_id`` got, within 30 s of the sidecar
    taking its leases."""
    deadline = time.monotonic() + 30
    with mesh.channel(mesh.sidecar.grpc_addr, token) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        while time.monotonic() < deadline:
            request = stream_pb2.FetchRequest(client_id=client_id, group=mesh.group, max_records=5)
            try:
                records = list(stub.Fetch(request, timeout=10).records)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                    raise
                records = []
            if records:
                return records
            time.sleep(0.2)
    raise AssertionError("the sidecar served nothing in 30 s")


def test_a_sidecar_credential_cannot_join_a_group_outside_its_scope(mesh: Secured) -> None:
    got = session(mesh, "stolen-sidecar", "stolen-sidecar", mesh.other, "127.0.0.1:1")
    report("stolen sidecar credential (serves the group) opens a Session for another group", got)
    assert got[:2] == ("PERMISSION_DENIED", "PERMISSION_DENIED")
    assert got[2]["permission"] == f"serve:{mesh.other}"


def test_a_sidecar_credential_cannot_advertise_another_host(mesh: Secured) -> None:
    got = session(mesh, "stolen-sidecar", "stolen-sidecar", mesh.group, "evil.example:443")
    report("stolen sidecar credential advertises evil.example:443 to its group's clients", got)
    assert got[:2] == ("PERMISSION_DENIED", "PERMISSION_DENIED")
    assert got[2]["permission"] == "advertise:evil.example"


def test_leave_of_a_live_session_by_another_identity_is_refused(mesh: Secured) -> None:
    fetched(mesh, "reader-a", "app-a")  # the sidecar's session is live: it serves
    request = assigner_pb2.LeaveRequest(sidecar_id=SIDECAR, group=mesh.group, graceful=False)
    with mesh.channel(mesh.assigner.grpc_addr, "thief") as channel:
        try:
            assigner_pb2_grpc.AssignerServiceStub(channel).Leave(request, timeout=10)
            got: Any = "OK: the holder's membership ended"
        except grpc.RpcError as err:
            got = refusal(err)
    report(f"an identity allowed to name {SIDECAR} calls Leave on its live session", got)
    assert got[:2] == ("PERMISSION_DENIED", "SESSION_HELD")


def test_a_viewer_knowing_the_epochs_cannot_hold_a_session(mesh: Secured) -> None:
    got = session(mesh, "viewer", SIDECAR, mesh.group, "127.0.0.1:1")
    report("a viewer (who reads every epoch) opens a Session as the sidecar", got)
    assert got[:2] == ("PERMISSION_DENIED", "PERMISSION_DENIED")


def test_a_reader_cannot_nack_another_readers_records(mesh: Secured) -> None:
    records = fetched(mesh, "reader-a", "app-a")
    nack = stream_pb2.NackRequest(client_id="app-a", group=mesh.group, all=True)
    nack.delay.FromSeconds(12 * 3600)
    with mesh.channel(mesh.sidecar.grpc_addr, "reader-b") as channel:
        try:
            answer = stream_pb2_grpc.StreamServiceStub(channel).Nack(nack, timeout=10)
            got: Any = f"OK: nacked {answer.records} records for 12 h"
        except grpc.RpcError as err:
            got = refusal(err)
    report(f"reader-b nacks (12 h) the {len(records)} records in flight to reader-a's app-a", got)
    assert got[:2] == ("PERMISSION_DENIED", "PERMISSION_DENIED")
    assert got[2]["permission"] == "client_id:app-a"


def test_a_commit_cannot_skip_records_the_reader_never_read(mesh: Secured) -> None:
    fetched(mesh, "reader-a", "app-a")  # the sidecar holds the partitions
    with mesh.channel(mesh.sidecar.grpc_addr, "reader-a") as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        deadline = time.monotonic() + 30
        while True:  # the high watermark comes with the sidecar's Kafka statistics
            status = stub.Status(stream_pb2.StatusRequest(), timeout=10)
            known = [p for p in status.partitions if p.high_watermark > p.committed_offset]
            if known or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        part = known[0]
        last = part.high_watermark - 1
        read = stream_pb2.ReadRangeRequest(
            client_id="spark-a", group=mesh.group, topic=part.topic, partition=part.partition,
            from_offset=last, to_offset=last + 1,
        )  # fmt: skip
        chunks = list(stub.ReadRange(read, timeout=30))
        commit = stream_pb2.CommitOffsetsRequest(
            client_id="spark-a", group=mesh.group,
            offsets=[stream_pb2.OffsetCommit(
                topic=part.topic, partition=part.partition, offset=last + 1,
                lease_epoch=chunks[-1].lease_epoch,
            )],
        )  # fmt: skip
        (result,) = stub.CommitOffsets(commit, timeout=10).results
    got = (result.committed, stream_pb2.RejectReason.Name(result.reason), result.message)
    report(
        f"read only [{last}, {last + 1}) of {part.topic}[{part.partition}] "
        f"(committed {part.committed_offset}), commit {last + 1}",
        got,
    )
    assert got[:2] == (False, "REJECT_REASON_NOT_DELIVERED")


def test_a_huge_message_before_authentication_is_not_decoded(mesh: Secured) -> None:
    huge = health_pb2.HealthCheckRequest(service="x" * (17 * 1024 * 1024))
    settings = ConnectionSettings(retry=None)
    tls = TlsConfig(
        ca_file=mesh.pki.ca, cert_file=mesh.pki.cert(CLIENT), key_file=mesh.pki.key(CLIENT)
    )
    with open_channel(mesh.assigner.grpc_addr, settings.with_tls(tls)) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(huge, timeout=20)
            got: Any = "decoded"
        except grpc.RpcError as err:
            got = err.code().name  # type: ignore[attr-defined]
    report("a 17 MiB Health.Check without a token (public method, caller unknown)", got)
    assert got == "RESOURCE_EXHAUSTED"


def test_a_token_sent_to_a_sidecar_is_refused_at_the_assigner_and_the_notifier(
    mesh: Secured,
) -> None:
    """Tokens carry their audience: what a reader sent its sidecar (aud ds-sidecar), a
    sidecar that collected it replays at the assigner and at the notifier; the control
    plane's token (aud ds-assigner, ds-notifier) replayed at a sidecar. All refused."""
    fetched(mesh, "reader-a", "app-a")  # the reader's sidecar token is good at the sidecar
    reader_token = mesh.pki.sidecar_token("reader-a")
    with mesh.channel(mesh.assigner.grpc_addr, None, reader_token) as channel:
        bind = binding_pb2.BindRequest(group=mesh.group, client_id="app-a")
        try:
            binding_pb2_grpc.BindingServiceStub(channel).Bind(bind, timeout=10)
            at_assigner: Any = "OK: bound"
        except grpc.RpcError as err:
            at_assigner = refusal(err)
    report("a reader's sidecar token replayed at the assigner (Bind)", at_assigner)
    with mesh.channel(mesh.notifier.grpc_addr, None, reader_token) as channel:
        try:
            notifier_pb2_grpc.NotifierServiceStub(channel).ListFaults(
                notifier_pb2.ListFaultsRequest(), timeout=10
            )
            at_notifier: Any = "OK: listed"
        except grpc.RpcError as err:
            at_notifier = refusal(err)
    report("a reader's sidecar token replayed at the notifier (ListFaults)", at_notifier)
    control = mesh.pki.token("viewer")
    with mesh.channel(mesh.sidecar.grpc_addr, None, control) as channel:
        try:
            stream_pb2_grpc.StreamServiceStub(channel).Status(
                stream_pb2.StatusRequest(), timeout=10
            )
            at_sidecar: Any = "OK: status"
        except grpc.RpcError as err:
            at_sidecar = refusal(err)
    report(
        "a viewer's control-plane token (sent to the assigner) replayed at a sidecar", at_sidecar
    )
    with mesh.channel(mesh.assigner.grpc_addr, "viewer") as channel:
        groups = admin_pb2_grpc.AdminServiceStub(channel).ListGroups(
            admin_pb2.ListGroupsRequest(), timeout=10
        )
    assert mesh.group in {g.config.name for g in groups.groups}  # the same token, where it belongs
    for got, service in ((at_assigner, "ds-assigner"), (at_notifier, "ds-notifier")):
        assert got[:2] == ("UNAUTHENTICATED", "UNAUTHENTICATED"), got
        assert "the token is for ds-sidecar" in got[2]["why"], got
        assert f"accepts {service}" in got[2]["why"], got
    assert at_sidecar[:2] == ("UNAUTHENTICATED", "UNAUTHENTICATED"), at_sidecar
    assert "accepts ds-sidecar" in at_sidecar[2]["why"], at_sidecar
