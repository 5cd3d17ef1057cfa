"""deploy/docker-compose.yml is secure by default (issue 37): mTLS and tokens on every mesh
port, as its users meet it. Runs first (file order) on the stack the conftest brought up
with ``compose.up()`` and no flag, the records-flow tests of test_compose_stack.py after it.

* a plaintext gRPC call to the assigner, and a plaintext HTTP request to its /healthz, are
  refused; so is TLS without a client certificate;
* the stack's client certificate without a token is ``UNAUTHENTICATED``; with the admin
  token the call works; a demo application's token (a reader of orders-demo) may not list
  the groups (``PERMISSION_DENIED``);
* Prometheus scrapes every mesh target over mTLS (up == 1), and Consul's gRPC health checks
  of the TLS ports pass (the assigners' leader lock is bound to them);
* the signing keys are not in the directory the containers mount.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
import urllib.request

import grpc
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from dsclient.connection import ConnectionSettings, TlsConfig, open_channel
from dsclient.reasons import error_info
from services.devstack import compose_security
from tests.compose.stack import CONSUL, GROUP, Stack, client_tls, http_json, pki, wait_until

pytestmark = [pytest.mark.compose, pytest.mark.slow, pytest.mark.timeout(600)]

NO_RETRY = ConnectionSettings(retry=None)
MESH_TARGETS = 7  # two assigners, the notifier, two sidecars, two demo applications


def _tls(token: str | None, certificate: str | None = compose_security.CLIENT) -> TlsConfig:
    files = pki()
    return TlsConfig(
        ca_file=files.ca,
        cert_file=files.cert(certificate) if certificate else None,
        key_file=files.key(certificate) if certificate else None,
        token_file=files.token(token) if token else None,
    )


def _list_groups(
    address: str, settings: ConnectionSettings
) -> tuple[str, dict[str, str], list[str]]:
    """(status code name, ErrorInfo reason and metadata, group names) of ListGroups."""
    with open_channel(address, settings) as channel:
        try:
            response = admin_pb2_grpc.AdminServiceStub(channel).ListGroups(
                admin_pb2.ListGroupsRequest(), timeout=10
            )
        except grpc.RpcError as err:
            info = error_info(err)
            meta = {"reason": info.reason, **info.metadata} if info else {}
            return err.code().name, meta, []
    return "OK", {}, [g.config.name for g in response.groups]


def test_plaintext_and_no_client_certificate_are_refused(stack: Stack) -> None:
    leader = stack.leader()
    assert leader is not None
    code, _, _ = _list_groups(leader, NO_RETRY)
    assert code == "UNAVAILABLE"  # the handshake failed: the port speaks TLS only
    code, _, _ = _list_groups(leader, NO_RETRY.with_tls(_tls("admin", certificate=None)))
    assert code == "UNAVAILABLE"  # TLS, but no client certificate: mTLS refuses it
    for port in (7071, 7081, 7091, 7082):  # assigner, sidecar, notifier, demo application
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    # HTTPS without a client certificate: refused too (the health checks present theirs).
    no_cert = ssl.create_default_context(cafile=str(pki().ca))
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen("https://127.0.0.1:7071/healthz", timeout=5, context=no_cert)
    assert http_json("https://127.0.0.1:7071/healthz", context=client_tls())


def test_a_token_names_the_caller_and_the_policy_decides(stack: Stack) -> None:
    leader = stack.leader()
    assert leader is not None
    code, meta, _ = _list_groups(leader, NO_RETRY.with_tls(_tls(None)))
    assert (code, meta["reason"]) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
    code, _, groups = _list_groups(leader, NO_RETRY.with_tls(_tls("admin")))
    assert (code, groups) == ("OK", [GROUP])
    code, meta, _ = _list_groups(leader, NO_RETRY.with_tls(_tls("demo-a")))
    assert (code, meta["identity"], meta["permission"]) == ("PERMISSION_DENIED", "demo-a", "view")


def test_prometheus_scrapes_the_mesh_over_mtls_and_consul_checks_over_tls(stack: Stack) -> None:
    def mesh_up() -> dict[str, float]:
        query = urllib.parse.urlencode({"query": 'up{job=~"ds-.*|demo-app"}'})
        result = http_json(f"http://127.0.0.1:9090/api/v1/query?{query}")["data"]["result"]
        values = {r["metric"]["instance"]: float(r["value"][1]) for r in result}
        return values if len(values) == MESH_TARGETS and set(values.values()) == {1.0} else {}

    up = wait_until(mesh_up, 60, "every mesh target scraped over mTLS")
    assert len(up) == MESH_TARGETS
    passing = {
        service: http_json(f"http://{CONSUL}/v1/health/service/{service}?passing=true")
        for service in ("ds-assigner", "ds-sidecar", "ds-notifier")
    }
    assert {s: len(nodes) for s, nodes in passing.items()} == {
        "ds-assigner": 2,
        "ds-sidecar": 2,
        "ds-notifier": 1,
    }
    checks = [c for nodes in passing.values() for n in nodes for c in n["Checks"]]
    assert all(c["Status"] == "passing" for c in checks)


def test_the_containers_cannot_mint_certificates_or_tokens(stack: Stack) -> None:
    mounted = {p.name for p in pki().directory.iterdir()}
    assert {"ca.pem", "jwt.pub", "policy.yaml", "admin.jwt"} <= mounted
    assert not mounted & set(compose_security.SIGNING_KEYS)
    listing = stack.podman(
        "exec", stack.container("sidecar-a"), "ls", compose_security.PKI_MOUNT
    ).split()
    assert "sidecar-a.jwt" in listing and "jwt.key" not in listing and "ca.key" not in listing
