"""The authorization interceptor on a service's Unix domain socket: a local socket skips
TLS (gRPC local credentials) but never the token check that applies on TCP. In-process
``grpc.aio`` server from the runtime's ``create_server`` with auth on and a socket; clients
from the connection module's ``open_aio_channel`` on the ``unix:`` target."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dsclient import local_socket
from dsclient.connection import PLAINTEXT, ConnectionSettings, TlsConfig, open_aio_channel
from dsclient.reasons import DsError, error_info
from services.consumer_sidecar.settings import SidecarSettings
from services.devstack.pki import DevPki, make_dev_pki
from services.runtime.auth import (
    AuthSettings,
    Guard,
    Permission,
    Verb,
    build_guard,
    current_identity,
)
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.settings import ServiceSettings

ROLES = {"ops": ["admin"], "reader": ["reader:demo"]}
NO_RETRY = ConnectionSettings(retry=None)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"), ROLES, certificates=["server", "ops"])


class Admin(admin_pb2_grpc.AdminServiceServicer):
    async def UpdateGroup(self, request: Any, context: Any) -> admin_pb2.UpdateGroupResponse:
        who = current_identity()
        return admin_pb2.UpdateGroupResponse(
            group=types_pb2.GroupConfig(name=who.name if who else "")
        )


@contextlib.asynccontextmanager
async def serving_admin(
    settings: ServiceSettings, guard: Guard, tmp_path: Path
) -> AsyncIterator[tuple[str, int]]:
    """An AdminService answering who called (:class:`Admin`) from the runtime's
    ``create_server`` with ``guard``'s interceptor, on TCP and a Unix socket: yields the
    socket's target and the TCP port; stopped on exit."""
    services = [
        GrpcService(
            "dataservice.assigner.v1.AdminService",
            Admin(),
            admin_pb2_grpc.add_AdminServiceServicer_to_server,
        )
    ]
    path = tmp_path / "sidecar-a.sock"
    server = create_server(settings, services, auth=guard.interceptor(), local_socket_path=path)
    await server.server.start()
    try:
        yield local_socket.target(path), server.port
    finally:
        await server.server.stop(0)


async def _update(target: str, tls: TlsConfig) -> tuple[str, str]:
    """(code name, the caller's name or the ErrorInfo reason) of one UpdateGroup."""
    channel = open_aio_channel(target, NO_RETRY.with_tls(tls))
    try:
        response = await admin_pb2_grpc.AdminServiceStub(channel).UpdateGroup(
            admin_pb2.UpdateGroupRequest(), timeout=5
        )
        return "OK", response.group.name
    except grpc.aio.AioRpcError as err:
        info = error_info(err)
        return err.code().name, info.reason if info else ""
    finally:
        await channel.close()


def test_the_socket_checks_the_token_as_tcp_does(pki: DevPki, tmp_path: Path) -> None:
    asyncio.run(_scenario(pki, tmp_path))


async def _scenario(pki: DevPki, tmp_path: Path) -> None:
    settings = ServiceSettings(
        tls=TlsConfig(
            ca_file=pki.ca,
            cert_file=pki.cert("server"),
            key_file=pki.key("server"),
            client_auth="require",
        ),
        auth=AuthSettings(
            enabled=True,
            policy_file=pki.policy,
            identity_from="token_or_certificate",
            jwt_key_file=pki.jwt_public_key,
        ),
    )
    guard = build_guard(settings.auth, CollectorRegistry(), "ds-sidecar")
    assert guard is not None
    async with serving_admin(settings, guard, tmp_path) as (unix, port):
        tcp = f"localhost:{port}"
        # No token: refused (on TCP, without a certificate, the handshake fails).
        assert await _update(unix, PLAINTEXT) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
        assert (await _update(tcp, TlsConfig(ca_file=pki.ca)))[0] == "UNAVAILABLE"
        # A token: who the caller is, and what its roles allow.
        token = TlsConfig(ca_file=pki.ca, token_file=pki.sidecar_token("ops"))
        assert await _update(unix, token) == ("OK", "ops")
        reader = TlsConfig(ca_file=pki.ca, token_file=pki.sidecar_token("reader"))
        assert await _update(unix, reader) == ("PERMISSION_DENIED", "PERMISSION_DENIED")
        # A client certificate identifies a caller on TCP, never on the socket (no TLS
        # there): a certificate-only client is refused on it (and so dials TCP,
        # dsclient.transport).
        cert = TlsConfig(ca_file=pki.ca, cert_file=pki.cert("ops"), key_file=pki.key("ops"))
        assert await _update(tcp, cert) == ("OK", "ops")
        assert await _update(unix, cert) == ("UNAUTHENTICATED", "UNAUTHENTICATED")


def test_auth_without_tls_only_for_a_sidecar_s_socket(pki: DevPki, tmp_path: Path) -> None:
    """The settings rule: auth with no TLS is accepted only for a sidecar that serves its
    pod's socket (uds_dir) and listens on loopback; any other service or address needs TLS."""
    auth = AuthSettings(
        enabled=True, policy_file=pki.policy, identity_from="token", jwt_key_file=pki.jwt_public_key
    )
    for host in ("127.0.0.1", "::1", "localhost"):
        settings = SidecarSettings(group="demo", uds_dir=tmp_path, host=host, auth=auth)
        assert settings.tokens_only_on_socket()
    for kind, values in (
        (SidecarSettings, {"group": "demo", "uds_dir": tmp_path, "host": "0.0.0.0"}),
        (SidecarSettings, {"group": "demo", "host": "127.0.0.1"}),
        (ServiceSettings, {"host": "127.0.0.1"}),
    ):
        with pytest.raises(ValidationError, match=r"auth\.enabled needs tls\.cert_file"):
            kind(**values, auth=auth)


def test_without_tls_a_sidecar_authenticates_on_its_socket_only(
    pki: DevPki, tmp_path: Path
) -> None:
    asyncio.run(_socket_only(pki, tmp_path))


async def _socket_only(pki: DevPki, tmp_path: Path) -> None:
    settings = SidecarSettings(
        group="demo",
        uds_dir=tmp_path,
        auth=AuthSettings(
            enabled=True,
            policy_file=pki.policy,
            identity_from="token",
            jwt_key_file=pki.jwt_public_key,
        ),
    )
    guard = build_guard(settings.auth, CollectorRegistry(), "ds-sidecar", socket_only=True)
    assert guard is not None
    ops = pki.sidecar_token("ops")
    async with serving_admin(settings, guard, tmp_path) as (unix, port):
        tcp = f"127.0.0.1:{port}"
        # On the socket: the token decides, as with TLS.
        assert await _update(unix, TlsConfig(token_file=ops)) == ("OK", "ops")
        reader = TlsConfig(token_file=pki.sidecar_token("reader"))
        assert await _update(unix, reader) == ("PERMISSION_DENIED", "PERMISSION_DENIED")
        assert await _update(unix, PLAINTEXT) == ("UNAUTHENTICATED", "UNAUTHENTICATED")
        # The client library never sends a token over plaintext TCP ...
        with pytest.raises(ValueError, match="need TLS"):
            open_aio_channel(tcp, NO_RETRY.with_tls(TlsConfig(token_file=ops)))
        # ... and a client that does is refused all the same; health stays public (probes).
        async with grpc.aio.insecure_channel(tcp) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await admin_pb2_grpc.AdminServiceStub(channel).UpdateGroup(
                    admin_pb2.UpdateGroupRequest(),
                    metadata=(("authorization", f"Bearer {ops.read_text().strip()}"),),
                    timeout=5,
                )
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert "pod socket (uds_dir) only" in str(refused.value.details())
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        # The HTTP pages (never on the socket) take no token either.
        with pytest.raises(DsError, match="pod socket"):
            guard.check("GET /ui", ops.read_text().strip(), None, Permission(Verb.VIEW))
