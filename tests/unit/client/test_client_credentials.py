"""DsClient's bearer token (docs/client-protocol.md §11): never over plaintext, and read
again when its file changes. Against the scripted assigner (clients/python/tests/scripted.py)
served with TLS from a development PKI, which logs every call's metadata."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from scripted import Assigner, Servers, binding, wait_for

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
