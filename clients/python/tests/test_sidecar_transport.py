"""Which target the client dials for a bound sidecar (``dsclient.transport``), and
how a bound sidecar falls back from its socket to TCP (``Sidecar.fall_back``)."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2_grpc
from dsclient import local_socket
from dsclient.connection import PLAINTEXT, TlsConfig
from dsclient.sidecar import Sidecar
from dsclient.transport import sidecar_target

ADDRESS = "10.0.0.7:7080"
LOCAL = "unix:/var/run/dataservice/sidecar-pod-a.sock"
CERT_ONLY = TlsConfig(
    ca_file=Path("/ca.pem"), cert_file=Path("/app.pem"), key_file=Path("/app.key")
)
CERT_AND_TOKEN = TlsConfig(
    ca_file=Path("/ca.pem"),
    cert_file=Path("/app.pem"),
    key_file=Path("/app.key"),
    token_file=Path("/token"),
)
TOKEN_ONLY = TlsConfig(ca_file=Path("/ca.pem"), token_file=Path("/token"))


def test_the_socket_when_the_binding_names_one_and_it_accepts() -> None:
    asked: list[Path] = []
    target = sidecar_target(ADDRESS, LOCAL, PLAINTEXT, lambda p: asked.append(p) or True)
    assert target == LOCAL
    assert asked == [Path("/var/run/dataservice/sidecar-pod-a.sock")]


def test_tcp_when_the_socket_does_not_accept() -> None:
    """No such file here (another pod's sidecar), or nobody listening (a killed one)."""
    assert sidecar_target(ADDRESS, LOCAL, PLAINTEXT, lambda p: False) == ADDRESS


def test_tcp_when_the_binding_names_no_socket() -> None:
    def never(path: Path) -> bool:
        raise AssertionError("not asked without a unix: target")

    assert sidecar_target(ADDRESS, "", PLAINTEXT, never) == ADDRESS
    assert sidecar_target(ADDRESS, "10.0.0.7:7090", PLAINTEXT, never) == ADDRESS


def test_a_client_known_only_by_its_certificate_stays_on_tcp() -> None:
    """A socket carries no certificate: such a caller would be UNAUTHENTICATED there."""
    assert sidecar_target(ADDRESS, LOCAL, CERT_ONLY, lambda p: True) == ADDRESS
    assert sidecar_target(ADDRESS, LOCAL, CERT_AND_TOKEN, lambda p: True) == LOCAL
    assert sidecar_target(ADDRESS, LOCAL, TOKEN_ONLY, lambda p: True) == LOCAL


@given(
    local=st.sampled_from(["", LOCAL, "unix:///tmp/s-x.sock", "dns:///x:1", "10.0.0.8:1"]),
    tls=st.sampled_from([PLAINTEXT, CERT_ONLY, CERT_AND_TOKEN, TOKEN_ONLY]),
    accepting=st.booleans(),
)
def test_the_socket_exactly_when_every_condition_holds(
    local: str, tls: TlsConfig, accepting: bool
) -> None:
    target = sidecar_target(ADDRESS, local, tls, lambda p: accepting)
    wanted = local.startswith("unix:") and tls is not CERT_ONLY and accepting
    assert target == (local if wanted else ADDRESS)


def _sidecar(target: str, opened: list[str]) -> Sidecar:
    def reopen(to: str) -> grpc.Channel:
        opened.append(to)
        return grpc.insecure_channel(to)

    channel = grpc.insecure_channel(target)
    return Sidecar(
        ADDRESS,
        channel,
        stream_pb2_grpc.StreamServiceStub(channel),
        target=target,
        local_address=LOCAL,
        reopen=reopen,
    )


def test_a_failed_socket_falls_back_to_tcp_once() -> None:
    opened: list[str] = []
    sidecar = _sidecar(LOCAL, opened)
    assert sidecar.local
    old_fetch = sidecar.fetch
    assert sidecar.fall_back() is True
    assert (sidecar.target, sidecar.local, opened) == (ADDRESS, False, [ADDRESS])
    assert sidecar.fetch is not old_fetch  # calls from now on go over the new channel
    assert sidecar.fall_back() is False  # already on TCP: nothing to do
    assert opened == [ADDRESS]
    sidecar.close()


def test_a_sidecar_on_tcp_has_nothing_to_fall_back_to() -> None:
    opened: list[str] = []
    sidecar = _sidecar(ADDRESS, opened)
    assert not sidecar.local
    assert sidecar.fall_back() is False
    assert opened == []
    sidecar.close()


# Who serves the socket (issue 37, finding 1): a client sends its token over the socket only
# when nobody but the socket's owner could have put it there. A directory others may write
# (a world-writable /tmp, a group-writable volume) lets anyone who can write it replace the
# file with a listener of their own and collect the tokens sent to it.


def _listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    return server


@pytest.mark.parametrize("directory_mode", [0o777, 0o1777, 0o770, 0o757])
def test_a_socket_in_a_directory_others_may_write_is_not_used(
    tmp_path: Path, directory_mode: int
) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(directory_mode)
    path = directory / "sidecar-pod-a.sock"
    with _listening(path):
        assert local_socket.accepts(path)  # someone answers there ...
        why = local_socket.untrusted(path)
        print(f"socket in a {directory_mode:o} directory: {why}")
        assert why is not None and "writable" in why
        # ... but the client does not send its token to it: TCP (TLS) instead
        assert sidecar_target(ADDRESS, f"unix:{path}", TOKEN_ONLY) == ADDRESS


def test_a_socket_in_a_directory_only_its_owner_writes_is_used(tmp_path: Path) -> None:
    directory = tmp_path / "private"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)
    path = directory / "sidecar-pod-a.sock"
    with _listening(path):
        path.chmod(0o660)
        assert local_socket.untrusted(path) is None
        assert sidecar_target(ADDRESS, f"unix:{path}", TOKEN_ONLY) == f"unix:{path}"


def test_a_symlink_to_a_socket_is_not_used(tmp_path: Path) -> None:
    """A link could point anywhere its writer likes: the file itself is checked."""
    private = tmp_path / "private"
    private.mkdir(mode=0o750)
    private.chmod(0o750)
    real = private / "real.sock"
    link = private / "sidecar-pod-a.sock"
    with _listening(real):
        link.symlink_to(real)
        assert local_socket.untrusted(link) == f"{link} is not a socket"
        assert sidecar_target(ADDRESS, f"unix:{link}", TOKEN_ONLY) == ADDRESS
        linked_dir = tmp_path / "linked"
        linked_dir.symlink_to(private)
        assert "is not a directory" in (local_socket.untrusted(linked_dir / "real.sock") or "")


def test_a_world_writable_socket_file_is_not_used(tmp_path: Path) -> None:
    directory = tmp_path / "private"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)
    path = directory / "sidecar-pod-a.sock"
    with _listening(path):
        path.chmod(0o666)
        assert local_socket.untrusted(path) == f"{path} is writable by every user"
