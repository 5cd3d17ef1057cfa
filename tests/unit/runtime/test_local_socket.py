"""A service's port on a Unix domain socket (``dsclient.local_socket`` through
``create_server``): mode 0660, a stale file replaced, a live one never taken over, the
file gone after stop; a channel from the connection module reaches it."""

from __future__ import annotations

import asyncio
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dsclient import local_socket
from dsclient.connection import ConnectionSettings, open_aio_channel
from services.runtime.grpcserver import create_server
from services.runtime.settings import ServiceSettings

SETTINGS = ServiceSettings(host="127.0.0.1", grpc_port=0, http_port=0)


async def _health(target: str) -> int:
    channel = open_aio_channel(target, ConnectionSettings(retry=None))
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return int(response.status)
    finally:
        await channel.close()


def test_served_on_the_socket_beside_tcp_then_removed(tmp_path: Path) -> None:
    path = tmp_path / "sidecar-a.sock"

    async def main() -> None:
        server = create_server(SETTINGS, [], local_socket_path=path)
        await server.server.start()
        try:
            await server.set_serving(True)
            assert stat.S_ISSOCK(path.stat().st_mode)
            assert stat.S_IMODE(path.stat().st_mode) == 0o660
            serving = health_pb2.HealthCheckResponse.SERVING
            assert await _health(local_socket.target(path)) == serving
            assert await _health(f"127.0.0.1:{server.port}") == serving
        finally:
            await server.server.stop(None)
        local_socket.release(path)

    asyncio.run(main())
    assert not path.exists()


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    """A killed process leaves its file behind, with nobody listening."""
    path = tmp_path / "sidecar-a.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))
    assert path.exists() and not local_socket.accepts(path)

    async def main() -> None:
        server = create_server(SETTINGS, [], local_socket_path=path)
        await server.server.start()
        try:
            assert local_socket.accepts(path)
        finally:
            await server.server.stop(None)

    asyncio.run(main())


def test_a_socket_a_live_process_serves_is_never_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "sidecar-a.sock"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen()

        async def main() -> None:
            with pytest.raises(OSError, match="another process accepts connections"):
                create_server(SETTINGS, [], local_socket_path=path)

        asyncio.run(main())
        assert local_socket.accepts(path)


def test_a_path_too_long_for_a_socket_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="longer than 107 bytes"):
        local_socket.claim(tmp_path / ("x" * 120))


@pytest.mark.parametrize(
    ("target", "sidecar_id", "names"),
    [
        ("unix:/var/run/ds/sidecar-pod-a.sock", "pod-a", True),
        ("unix:///var/run/ds/sidecar-pod-a.sock", "pod-a", True),
        ("unix:/var/run/ds/sidecar-pod-b.sock", "pod-a", False),
        ("unix:/var/run/pod-a/sidecar.sock", "pod-a", False),  # the id in the file name only
        ("unix:/var/run/ds/sidecar-pod-ab.sock", "pod-a", False),  # another sidecar's socket
        ("unix:/var/run/ds/sidecar-pod-a.sock.old", "pod-a", False),
        ("unix:relative/sidecar-pod-a.sock", "pod-a", False),
        ("10.0.0.1:7080", "pod-a", False),
        ("unix:", "pod-a", False),
    ],
)
def test_what_the_assigner_accepts_as_a_local_endpoint(
    target: str, sidecar_id: str, names: bool
) -> None:
    assert local_socket.names_sidecar(target, sidecar_id) is names


def test_the_sidecar_serves_in_a_directory_only_it_writes() -> None:
    """Issue 37, finding 12: in a volume every user may write (an emptyDir is 0777, /tmp
    1777) the socket and the segments live in the sidecar's own directory, mode 0750, which
    the client's check (``local_socket.untrusted``) accepts; the volume itself it refuses."""
    from services.consumer_sidecar.settings import SidecarSettings

    # A short volume path: pytest's tmp_path under xdist (…/popen-gw0/test_…0/) leaves the
    # socket past the 107 bytes a Unix socket path may have.
    volume = Path(tempfile.mkdtemp(prefix="ds-vol-", dir="/tmp"))
    volume.chmod(0o777)
    settings = SidecarSettings(group="g", id="pod-a", uds_dir=volume)
    path = settings.local_socket_path
    assert path is not None and path.parent == volume / "sidecar-pod-a.d"

    async def main() -> None:
        server = create_server(SETTINGS, [], local_socket_path=path)
        await server.server.start()
        try:
            directory = stat.S_IMODE(path.parent.lstat().st_mode)
            print(
                f"volume 777, the sidecar's directory {directory:o}, socket "
                f"{stat.S_IMODE(path.lstat().st_mode):o}: {local_socket.untrusted(path)}"
            )
            assert directory == 0o750
            assert local_socket.untrusted(path) is None and local_socket.usable(path)
        finally:
            await server.server.stop(None)
        local_socket.release(path)

    try:
        asyncio.run(main())
        with socket.socket(socket.AF_UNIX) as planted:  # another user's listener in the volume
            planted.bind(str(volume / "sidecar-pod-a.sock"))
            assert "writable" in (local_socket.untrusted(volume / "sidecar-pod-a.sock") or "")
    finally:
        shutil.rmtree(volume, ignore_errors=True)


def test_a_link_in_place_of_the_directory_is_not_served_in(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "sidecar-pod-a.d").symlink_to(elsewhere)
    with pytest.raises(OSError, match="not a directory of this user"):
        local_socket.claim(tmp_path / "sidecar-pod-a.d" / "sidecar-pod-a.sock")
