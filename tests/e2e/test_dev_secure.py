"""``dsctl dev up --secure``: the whole stack with TLS and mTLS on every port, tokens and
authorization, checked as its users meet it (issue 18's acceptance for transport, identity,
authorization and session ownership).

* a plaintext client (gRPC and HTTP) is refused at the handshake;
* a TLS client with no token is ``UNAUTHENTICATED``;
* the ``reader-demo`` identity reads group demo (records counted), and is
  ``PERMISSION_DENIED`` reading another group, calling ``UpdateGroup`` or opening a Session;
* an identity the policy lets name ``sidecar-0`` (added to the live policy file, which is
  re-read) cannot take over sidecar-0's live Session (``SESSION_HELD``), and sidecar-0 keeps
  every lease at the same epoch;
* grpcurl with the dev CA, the client certificate and a token works; ``/ui`` wants a
  viewer; dsctl works with the ``DS_TLS__*`` variables the stack prints.

Uses the fixed service ports of ARCHITECTURE §9, like tests/e2e/test_dsctl_dev.py.
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from dataservice.assigner.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    assigner_pb2,
    assigner_pb2_grpc,
    types_pb2,
)
from dsclient import ClientError, DsClient
from dsclient.connection import ConnectionSettings, TlsConfig, open_channel
from dsclient.reasons import error_info
from services.devstack.cache import cache_dir
from services.devstack.pki import DevPki, sign_token
from services.devstack.ports import free_port
from tests.support.dev_stacks import dev_env, dev_state, down_and_gone, dsctl, require_free

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

FIXED_PORTS = (7070, 7071, 7080, 7081, 7082, 7083, 7090, 7091)
ASSIGNER = "127.0.0.1:7070"
NO_RETRY = ConnectionSettings(retry=None)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevPki, dict[str, str]]]:
    require_free(FIXED_PORTS)
    root = tmp_path_factory.mktemp("secure")
    env = dev_env(root / "dev", plain=True)
    kafka_port = free_port()
    up = dsctl("dev", "up", "--detach", "--secure", "--kafka-port", str(kafka_port), env=env)
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = dev_state(env)
        pids = [c["pid"] for c in state["components"]]
        assert all(c["healthy"] in (True, None) for c in state["components"]), state
        pki = DevPki(Path(state["pki"]))
        assert f"DS_TLS__CA_FILE={pki.ca}" in up.stdout
        yield pki, env
    finally:
        down_and_gone(env, pids)


def tls(pki: DevPki, token: str | None) -> TlsConfig:
    return TlsConfig(
        ca_file=pki.ca,
        cert_file=pki.cert("client"),
        key_file=pki.key("client"),
        token_file=pki.token(token) if token else None,
        # what it sends sidecars: each service accepts only tokens minted for it
        sidecar_token_file=pki.sidecar_token(token) if token else None,
    )


def admin_call(pki: DevPki, token: str | None, call: str) -> tuple[str, dict[str, str]]:
    """(status code name, ErrorInfo reason and metadata) of one AdminService call."""
    with open_channel(ASSIGNER, NO_RETRY.with_tls(tls(pki, token))) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            if call == "list":
                stub.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10)
            else:
                stub.UpdateGroup(
                    admin_pb2.UpdateGroupRequest(group=types_pb2.GroupConfig(name="demo")),
                    timeout=10,
                )
            return "OK", {}
        except grpc.RpcError as err:
            info = error_info(err)
            meta = {"reason": info.reason, **info.metadata} if info else {}
            return err.code().name, meta


def open_session(pki: DevPki, token: str, sidecar_id: str) -> tuple[str, dict[str, str]]:
    with open_channel(ASSIGNER, NO_RETRY.with_tls(tls(pki, token))) as channel:
        stub = assigner_pb2_grpc.AssignerServiceStub(channel)
        join = assigner_pb2.SessionRequest(
            join=assigner_pb2.SessionJoin(
                sidecar_id=sidecar_id, group="demo", endpoint="127.0.0.1:1"
            )
        )
        try:
            for response in stub.Session(iter([join]), timeout=10):
                return f"OK {response.WhichOneof('kind')}", {}
            return "ENDED", {}
        except grpc.RpcError as err:
            info = error_info(err)
            meta = {"reason": info.reason, **info.metadata} if info else {}
            return err.code().name, meta


def leases_of(pki: DevPki, sidecar: str) -> dict[tuple[str, int], int]:
    with open_channel(ASSIGNER, NO_RETRY.with_tls(tls(pki, "admin"))) as channel:
        response = admin_pb2_grpc.AdminServiceStub(channel).DescribeGroup(
            admin_pb2.DescribeGroupRequest(group="demo"), timeout=10
        )
    return {
        (lease.topic, lease.partition): lease.epoch
        for lease in response.leases
        if lease.holder == sidecar
    }


def test_plaintext_is_refused_and_no_token_is_unauthenticated(
    stack: tuple[DevPki, dict[str, str]],
) -> None:
    pki, _ = stack
    with open_channel(ASSIGNER, NO_RETRY) as channel, pytest.raises(grpc.RpcError) as refused:
        admin_pb2_grpc.AdminServiceStub(channel).ListGroups(
            admin_pb2.ListGroupsRequest(), timeout=5
        )
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    with pytest.raises(OSError):
        urllib.request.urlopen("http://127.0.0.1:7071/healthz", timeout=5)
    code, meta = admin_call(pki, None, "list")
    assert (code, meta["reason"]) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
    assert admin_call(pki, "admin", "list") == ("OK", {})


def test_a_reader_of_demo_reads_demo_and_nothing_else(
    stack: tuple[DevPki, dict[str, str]],
) -> None:
    pki, _ = stack
    reader = NO_RETRY.with_tls(tls(pki, "reader-demo"))
    with DsClient("demo", client_id="secure-reader", assigner=ASSIGNER, connection=reader) as c:
        got: list[object] = []
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            batch = c.fetch(max_records=50, max_wait=1.0)
            got += batch
            c.ack(batch)
        assert len(got) >= 20
    with pytest.raises(ClientError) as other_group:
        DsClient("ds-probe", client_id="secure-reader", assigner=ASSIGNER, connection=reader)
    cause = other_group.value.__cause__
    assert isinstance(cause, grpc.RpcError)
    assert cause.code() is grpc.StatusCode.PERMISSION_DENIED
    info = error_info(cause)
    assert info is not None and info.metadata["permission"] == "read:ds-probe"
    code, meta = admin_call(pki, "reader-demo", "update")
    assert (code, meta["permission"], meta["identity"]) == (
        "PERMISSION_DENIED",
        "admin",
        "reader-demo",
    )
    code, meta = open_session(pki, "reader-demo", "sidecar-0")
    assert (code, meta["permission"]) == ("PERMISSION_DENIED", "session:sidecar-0")


def test_a_live_session_cannot_be_taken_over_by_another_identity(
    stack: tuple[DevPki, dict[str, str]],
) -> None:
    pki, _ = stack
    before = leases_of(pki, "sidecar-0")
    assert len(before) == 12
    # An identity the (live, re-read) policy lets name sidecar-0: a misconfiguration, or a
    # stolen role; it still cannot replace the sidecar's live session.
    policy = pki.policy.read_text()
    pki.policy.write_text(
        policy.replace(
            "identities:\n", "identities:\n  intruder: [sidecar:sidecar-0, serves:demo]\n"
        )
    )
    key = load_pem_private_key((pki.directory / "jwt.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    pki.token("intruder").write_text(sign_token(key, "intruder"))
    time.sleep(1.5)  # the policy is looked at once a second at most
    code, meta = open_session(pki, "intruder", "sidecar-0")
    assert (code, meta["reason"], meta["sidecar_id"]) == (
        "PERMISSION_DENIED",
        "SESSION_HELD",
        "sidecar-0",
    )
    time.sleep(4)  # more than a lease TTL (3 s): the real sidecar's leases were renewed
    assert leases_of(pki, "sidecar-0") == before


def test_grpcurl_ui_and_dsctl_with_the_dev_ca_and_a_token(
    stack: tuple[DevPki, dict[str, str]],
) -> None:
    pki, env = stack
    grpcurl = cache_dir() / "bin" / "grpcurl"
    token = pki.token("admin").read_text().strip()
    listed = subprocess.run(
        [
            str(grpcurl), "-cacert", str(pki.ca), "-cert", str(pki.cert("client")),
            "-key", str(pki.key("client")), "-H", f"authorization: Bearer {token}",
            ASSIGNER, "dataservice.assigner.v1.AdminService/ListGroups",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert '"name": "demo"' in listed.stdout

    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(pki.cert("client"), pki.key("client"))

    def ui(token: str | None) -> int:
        request = urllib.request.Request("https://127.0.0.1:7071/ui")
        if token:
            request.add_header("Authorization", f"Bearer {pki.token(token).read_text().strip()}")
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return err.code

    assert (ui(None), ui("reader-demo"), ui("viewer")) == (401, 403, 200)

    with_env = {
        **env,
        "DS_TLS__CA_FILE": str(pki.ca),
        "DS_TLS__CERT_FILE": str(pki.cert("client")),
        "DS_TLS__KEY_FILE": str(pki.key("client")),
        "DS_TLS__TOKEN_FILE": str(pki.token("viewer")),
    }
    groups = dsctl("groups", "--output", "json", env=with_env)
    assert groups.returncode == 0, groups.stderr
    assert "demo" in groups.stdout
    no_token = {k: v for k, v in with_env.items() if k != "DS_TLS__TOKEN_FILE"}
    refused = dsctl("groups", env=no_token)
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
