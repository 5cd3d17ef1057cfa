"""DsClient's bearer token (docs/client-protocol.md §11): never over plaintext, and read
again when its file changes. Against the scripted assigner (clients/python/tests/scripted.py)
served with TLS from a development PKI, which logs every call's metadata."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from scripted import Assigner, Servers, Sidecar, binding, wait_for

from dsclient import DsClient
from dsclient.connection import DEFAULT_SETTINGS, TlsConfig
from services.devstack.pki import make_dev_pki

REPO = Path(__file__).resolve().parents[3]


def test_a_token_without_tls_is_refused_before_any_call(tmp_path: Path) -> None:
    """C46: the library and dsread both refuse the configuration."""
    token = tmp_path / "token"
    token.write_text("secret")
    servers = Servers()
    assigner = Assigner(binding(1))
    try:
        address = servers.assigner(assigner)
        plaintext_token = DEFAULT_SETTINGS.with_tls(TlsConfig(token_file=token))
        try:
            DsClient("g", client_id="c", assigner=address, connection=plaintext_token)
        except ValueError as refused:
            assert "need TLS" in str(refused)
        else:
            raise AssertionError("a token over plaintext was accepted")
        assert assigner.metadata == []  # nothing was sent
    finally:
        servers.close()
    dsread = subprocess.run(
        [sys.executable, str(REPO / "clients/python/dsread.py"), "--assigner", address,
         "--group", "g", "--expect", "1", "--token-file", str(token)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dsread.returncode == 2, dsread.stderr
    assert "--token-file needs --ca" in dsread.stderr


def test_every_call_carries_the_token_and_a_rotated_one_from_the_next_call_on(
    tmp_path: Path,
) -> None:
    """C47."""
    pki = make_dev_pki(tmp_path / "pki", {}, certificates=["assigner"])
    token = tmp_path / "token"
    token.write_text("first-token\n")
    servers = Servers(
        grpc.ssl_server_credentials(
            [(pki.key("assigner").read_bytes(), pki.cert("assigner").read_bytes())]
        )
    )
    assigner = Assigner(binding(1))
    try:
        connection = DEFAULT_SETTINGS.with_tls(TlsConfig(ca_file=pki.ca, token_file=token))
        address = servers.assigner(assigner)
        with DsClient("g", client_id="c", assigner=address, connection=connection):
            wait_for(lambda: len(assigner.watches) == 1)
            token.write_text("the-second-token\n")
            time.sleep(1.2)  # a token file is looked at once a second at most
            assigner.watch.put(grpc.StatusCode.UNAVAILABLE)  # the client watches again
            wait_for(lambda: len(assigner.watches) == 2)
        sent = [m.get("authorization") for m in assigner.metadata]
        assert sent[:2] == ["Bearer first-token"] * 2  # Bind, the first watch
        assert sent[2:] == ["Bearer the-second-token"] * 2  # the next watch, Unbind
    finally:
        servers.close()


class TokenLoggingSidecar(Sidecar):
    """A scripted sidecar that logs the token of every Fetch."""

    def __init__(self) -> None:
        super().__init__(fetches=[])
        self.tokens: list[str | None] = []

    def Fetch(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.tokens.append(dict(context.invocation_metadata()).get("authorization"))  # type: ignore[arg-type]
        return super().Fetch(request, context)


def test_sidecars_get_the_sidecar_token_and_the_assigner_its_own(tmp_path: Path) -> None:
    """C56 (issue 37, tokens scoped by audience): with ``sidecar_token_file`` the assigner's
    calls carry ``token_file``'s token and the sidecars' calls the sidecar token, so what a
    sidecar receives is not the token the assigner accepts."""
    pki = make_dev_pki(tmp_path / "pki", {}, certificates=["assigner"])
    control, to_sidecars = tmp_path / "control.jwt", tmp_path / "sidecar.jwt"
    control.write_text("for-the-assigner\n")
    to_sidecars.write_text("for-the-sidecars\n")
    servers = Servers(
        grpc.ssl_server_credentials(
            [(pki.key("assigner").read_bytes(), pki.cert("assigner").read_bytes())]
        )
    )
    sidecar = TokenLoggingSidecar()
    try:
        sidecar_address = servers.sidecar(sidecar)
        assigner = Assigner(binding(1, sidecar_address))
        tls = TlsConfig(ca_file=pki.ca, token_file=control, sidecar_token_file=to_sidecars)
        address = servers.assigner(assigner)
        with DsClient(
            "g", client_id="c", assigner=address, connection=DEFAULT_SETTINGS.with_tls(tls)
        ) as client:
            client.fetch(max_records=1, max_wait=0.05)
            wait_for(lambda: len(assigner.watches) == 1)
        to_assigner = {m.get("authorization") for m in assigner.metadata}
        assert to_assigner == {"Bearer for-the-assigner"}, to_assigner
        assert sidecar.tokens and set(sidecar.tokens) == {"Bearer for-the-sidecars"}
    finally:
        servers.close()


@pytest.mark.parametrize(
    "flags",
    [["--cert", "c.pem", "--key", "k.pem"], ["--server-name", "assigner"]],
    ids=["cert", "server-name"],
)
def test_dsread_refuses_tls_settings_without_a_ca(flags: list[str]) -> None:
    """Without --ca dsread reads in plaintext: a client certificate or a server name would
    be ignored silently, so it is a usage error (exit 2), as in Go's and Java's dsread."""
    dsread = subprocess.run(
        [sys.executable, str(REPO / "clients/python/dsread.py"), "--assigner", "127.0.0.1:1",
         "--group", "g", "--expect", "1", *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dsread.returncode == 2, dsread.stderr
    assert "need --ca" in dsread.stderr
