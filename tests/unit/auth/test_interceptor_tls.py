"""TLS, mTLS, tokens and the authorization interceptor on an in-process ``grpc.aio`` server
(port 0) built by the runtime's own ``create_server``, with a development PKI made by
``services.devstack.pki``; clients from the connection module's ``open_aio_channel``.
Servicers are minimal: what is tested is who gets through, not what the servicer does."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, assigner_pb2, assigner_pb2_grpc
from dsclient.connection import ConnectionSettings, TlsConfig, open_aio_channel
from dsclient.reasons import error_info
from services.devstack.pki import DevPki, issue, make_ca, make_dev_pki, sign_token
from services.runtime.auth import AuthSettings, build_guard, current_identity
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.settings import ServiceSettings

ROLES = {
    "ops": ["admin"],
    "reader": ["reader:demo"],
    "sidecar-0": ["sidecar", "serves:demo"],
    "nobody": [],
}
NO_RETRY = ConnectionSettings(retry=None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(
        tmp_path_factory.mktemp("pki"), ROLES, certificates=["server", "ops", "stranger"]
    )


class Admin(admin_pb2_grpc.AdminServiceServicer):
    async def ListGroups(self, request: Any, context: Any) -> admin_pb2.ListGroupsResponse:
        who = current_identity()
        return admin_pb2.ListGroupsResponse(next_page_token=who.name if who else "")

    async def UpdateGroup(self, request: Any, context: Any) -> admin_pb2.UpdateGroupResponse:
        return admin_pb2.UpdateGroupResponse()


class Assigner(assigner_pb2_grpc.AssignerServiceServicer):
    async def Session(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[assigner_pb2.SessionResponse]:
        async for request in request_iterator:
            yield assigner_pb2.SessionResponse(
                accepted=assigner_pb2.SessionAccepted(session_id=request.join.sidecar_id)
            )
            return


def _server(pki: DevPki, *, client_auth: str, identity_from: str) -> Any:
    settings = ServiceSettings(
        tls=TlsConfig(
            ca_file=pki.ca,
            cert_file=pki.cert("server"),
            key_file=pki.key("server"),
            client_auth=client_auth,  # type: ignore[arg-type]
        ),
        auth=AuthSettings(
            enabled=True,
            policy_file=pki.policy,
            identity_from=identity_from,  # type: ignore[arg-type]
            jwt_key_file=pki.jwt_public_key,
        ),
    )
    guard = build_guard(settings.auth, CollectorRegistry(), "ds-assigner")
    assert guard is not None
    services = [
        GrpcService(
            "dataservice.assigner.v1.AdminService",
            Admin(),
            admin_pb2_grpc.add_AdminServiceServicer_to_server,
        ),
        GrpcService(
            "dataservice.assigner.v1.AssignerService",
            Assigner(),
            assigner_pb2_grpc.add_AssignerServiceServicer_to_server,
        ),
    ]
    return create_server(settings, services, auth=guard.interceptor()), guard


def _client(pki: DevPki, *, token: str | None = None, cert: str | None = None) -> TlsConfig:
    return TlsConfig(
        ca_file=pki.ca,
        cert_file=pki.cert(cert) if cert else None,
        key_file=pki.key(cert) if cert else None,
        token_file=pki.token(token) if token else None,
    )


async def _call(
    port: int, tls: TlsConfig | None, rpc: str = "list"
) -> tuple[str, str, dict[str, str]]:
    """(code name, answer or ErrorInfo reason, ErrorInfo metadata) of one call."""
    settings = NO_RETRY if tls is None else NO_RETRY.with_tls(tls)
    channel = open_aio_channel(f"127.0.0.1:{port}", settings)
    try:
        if rpc == "list":
            response = await admin_pb2_grpc.AdminServiceStub(channel).ListGroups(
                admin_pb2.ListGroupsRequest(), timeout=5
            )
            return "OK", response.next_page_token, {}
        if rpc == "update":
            await admin_pb2_grpc.AdminServiceStub(channel).UpdateGroup(
                admin_pb2.UpdateGroupRequest(), timeout=5
            )
            return "OK", "", {}
        sidecar = rpc.removeprefix("session:")
        call = assigner_pb2_grpc.AssignerServiceStub(channel).Session(timeout=5)
        await call.write(
            assigner_pb2.SessionRequest(
                join=assigner_pb2.SessionJoin(sidecar_id=sidecar, group="demo")
            )
        )
        response = await call.read()
        return "OK", response.accepted.session_id, {}
    except grpc.aio.AioRpcError as err:
        info = error_info(err)
        return err.code().name, info.reason if info else "", dict(info.metadata) if info else {}
    finally:
        await channel.close()


def test_tokens_over_tls_decide_who_may_do_what(pki: DevPki) -> None:
    async def scenario() -> None:
        grpc_server, guard = _server(pki, client_auth="none", identity_from="token")
        await grpc_server.server.start()
        port = grpc_server.port
        try:
            assert (await _call(port, None))[0] == "UNAVAILABLE"  # plaintext: no handshake
            code, reason, meta = await _call(port, _client(pki))
            assert (code, reason) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
            assert "no bearer token" in meta["why"]
            assert await _call(port, _client(pki, token="ops")) == ("OK", "ops", {})
            assert (await _call(port, _client(pki, token="ops"), "update"))[0] == "OK"
            code, reason, meta = await _call(port, _client(pki, token="reader"), "update")
            assert (code, reason, meta["permission"]) == (
                "PERMISSION_DENIED",
                "PERMISSION_DENIED",
                "admin",
            )
            code, _, meta = await _call(port, _client(pki, token="reader"), "session:sidecar-0")
            assert (code, meta["permission"]) == ("PERMISSION_DENIED", "session:sidecar-0")
            assert await _call(port, _client(pki, token="sidecar-0"), "session:sidecar-0") == (
                "OK",
                "sidecar-0",
                {},
            )
            code, _, meta = await _call(port, _client(pki, token="sidecar-0"), "session:sidecar-1")
            assert (code, meta["permission"]) == ("PERMISSION_DENIED", "session:sidecar-1")
            counted = {
                (s.labels["identity"], s.labels["code"]): s.value
                for m in guard.refusals.counter.collect()
                for s in m.samples
                if s.name.endswith("_total")
            }
            assert counted == {
                ("-", "UNAUTHENTICATED"): 1.0,
                ("reader", "PERMISSION_DENIED"): 2.0,
                ("sidecar-0", "PERMISSION_DENIED"): 1.0,
            }
        finally:
            await grpc_server.server.stop(0)

    asyncio.run(scenario())


def test_a_bad_or_foreign_token_is_unauthenticated(pki: DevPki, tmp_path: Path) -> None:
    foreign = make_dev_pki(tmp_path / "other", {"ops": ["admin"]}, certificates=[])
    expired_key = tmp_path / "expired.jwt"

    async def scenario() -> None:
        grpc_server, _ = _server(pki, client_auth="none", identity_from="token")
        await grpc_server.server.start()
        try:
            tls = TlsConfig(ca_file=pki.ca, token_file=foreign.token("ops"))
            code, _, meta = await _call(grpc_server.port, tls)
            assert code == "UNAUTHENTICATED" and "invalid token" in meta["why"]
            from cryptography.hazmat.primitives.serialization import load_pem_private_key

            key = load_pem_private_key((pki.directory / "jwt.key").read_bytes(), None)
            expired_key.write_text(sign_token(key, "ops", days=-1))  # type: ignore[arg-type]
            tls = TlsConfig(ca_file=pki.ca, token_file=expired_key)
            code, _, meta = await _call(grpc_server.port, tls)
            assert (code, meta["why"]) == ("UNAUTHENTICATED", "token expired")
        finally:
            await grpc_server.server.stop(0)

    asyncio.run(scenario())


def test_mtls_identity_is_the_certificate_subject(pki: DevPki, tmp_path: Path) -> None:
    stranger_ca = make_dev_pki(tmp_path / "stranger", {}, certificates=["ops"])

    async def scenario() -> None:
        grpc_server, _ = _server(pki, client_auth="require", identity_from="certificate")
        await grpc_server.server.start()
        port = grpc_server.port
        try:
            assert await _call(port, _client(pki, cert="ops")) == ("OK", "ops", {})
            code, _, meta = await _call(port, _client(pki, cert="stranger"))
            assert (code, meta["identity"]) == ("PERMISSION_DENIED", "stranger")
            assert (await _call(port, _client(pki)))[0] == "UNAVAILABLE"  # no client cert
            untrusted = TlsConfig(
                ca_file=pki.ca, cert_file=stranger_ca.cert("ops"), key_file=stranger_ca.key("ops")
            )
            assert (await _call(port, untrusted))[0] == "UNAVAILABLE"  # another CA's "ops"
        finally:
            await grpc_server.server.stop(0)

    asyncio.run(scenario())


def test_a_renewed_server_certificate_and_policy_are_picked_up(pki: DevPki, tmp_path: Path) -> None:
    """Certificates and the policy are files replaced at run time: the next handshake
    serves the new certificate, the next call sees the new policy, no restart."""
    live = DevPki(tmp_path / "live")
    shutil.copytree(pki.directory, live.directory)

    async def scenario() -> None:
        grpc_server, _ = _server(live, client_auth="none", identity_from="token")
        await grpc_server.server.start()
        port = grpc_server.port
        try:
            assert (await _call(port, _client(pki, token="reader"), "update"))[0] == (
                "PERMISSION_DENIED"
            )
            live.policy.write_text("identities: {reader: [admin], ops: [admin]}\n")
            time.sleep(1.1)  # the policy is looked at once a second at most
            assert (await _call(port, _client(pki, token="reader"), "update"))[0] == "OK"
            # A new CA signs a new server certificate: clients trusting only the old CA
            # fail the next handshake, clients trusting the new one succeed.
            new = DevPki(tmp_path / "new")
            ca = make_ca(new)
            issue(new, "server", ca)
            shutil.copy(new.cert("server"), live.cert("server"))
            shutil.copy(new.key("server"), live.key("server"))
            trusting_new = TlsConfig(ca_file=new.ca, token_file=pki.token("ops"))
            assert (await _call(port, trusting_new))[0] == "OK"
            assert (await _call(port, _client(pki, token="ops")))[0] == "UNAVAILABLE"
        finally:
            await grpc_server.server.stop(0)

    asyncio.run(scenario())


def test_health_is_public_and_tls_settings_are_validated(pki: DevPki) -> None:
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        TlsConfig(cert_file=pki.cert("server"))
    with pytest.raises(ValueError, match="client_auth=require needs"):
        TlsConfig(client_auth="require")
    env = {
        "DS_TLS__CA_FILE": str(pki.ca),
        "ds_tls__token_file": str(pki.token("ops")),
        "DS_TLS__SERVER_NAME": "localhost",
    }
    assert TlsConfig.from_env(env) == TlsConfig(
        ca_file=pki.ca, token_file=pki.token("ops"), server_name="localhost"
    )
    with pytest.raises(ValueError, match="DS_TLS__"):
        TlsConfig.from_env({"DS_TLS__CLIENT_AUTH": "maybe"})
