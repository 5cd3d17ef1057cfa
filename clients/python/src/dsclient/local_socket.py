"""A service's gRPC port on a Unix domain socket, for callers in its own pod.

The sidecar and its application share a pod: over a socket file in a volume both mount,
a call skips the TCP stack (and TLS, see below). The socket is served with gRPC's *local*
credentials (:func:`grpc.local_server_credentials`): no handshake on the wire, so a
plaintext client reaches it too, and a client's per-call credentials (the bearer token)
may be sent over it, which gRPC refuses on a plaintext channel. TLS is skipped (the
connection never leaves the kernel, and only processes that can open the file reach it:
mode 0660 in a directory shared by the pod's containers); the authorization interceptor
is not: every call on the socket is authenticated and authorized like one on TCP. A
caller known only by its client certificate has none on the socket, so it is refused
there (``UNAUTHENTICATED``): such a client stays on TCP (``dsclient.binding``).

The file is claimed at start (a stale one, left by a killed process, is replaced; one a
live process answers on is an error, never taken over) and removed on stop.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

SCHEME = "unix:"
SOCKET_MODE = 0o660
# sun_path is 108 bytes on Linux, its last one the terminating NUL.
MAX_PATH_BYTES = 107


def target(path: Path) -> str:
    """The gRPC target of a socket file: ``unix:/abs/path``."""
    return f"{SCHEME}{path}"


def path_of(target: str) -> Path | None:
    """The socket file a ``unix:`` target names (``unix:PATH`` or ``unix://ABS_PATH``);
    None for any other target."""
    if not target.startswith(SCHEME):
        return None
    rest = target[len(SCHEME) :]
    if rest.startswith("//"):
        rest = rest[2:]
    return Path(rest) if rest else None


def sidecar_file_name(sidecar_id: str) -> str:
    """The file name of a sidecar's socket: ``sidecar-ID.sock``."""
    return f"sidecar-{sidecar_id}.sock"


def segment_prefix(sidecar_id: str) -> str:
    """The file names of a sidecar's shared-memory segments (``DELIVERY_FORMAT_ARROW_SHM``,
    beside its socket) begin with this: ``sidecar-ID.shm-``."""
    return f"sidecar-{sidecar_id}.shm-"


def sweep_segments(directory: Path, sidecar_id: str) -> int:
    """Remove the segment files a previous run of this sidecar left (killed with streams
    open); how many. Call it once the socket is claimed (no live process has this id)."""
    removed = 0
    for path in directory.glob(f"{segment_prefix(sidecar_id)}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def names_sidecar(target: str, sidecar_id: str) -> bool:
    """Whether ``target`` is an absolute ``unix:`` target whose file is this sidecar's
    socket, ``sidecar-ID.sock`` (what the assigner accepts as a sidecar's local endpoint:
    a sidecar cannot name another's socket, even one whose id contains its own)."""
    path = path_of(target)
    return path is not None and path.is_absolute() and path.name == sidecar_file_name(sidecar_id)


def accepts(path: Path, timeout: float = 0.25) -> bool:
    """Whether a process accepts connections on the socket file ``path`` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(os.fspath(path))
        except OSError:
            return False
    return True


def claim(path: Path) -> None:
    """Make ``path`` free for a new socket: remove a stale file; OSError if the path is
    too long, or a live process serves it (two processes never share a socket)."""
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise OSError(f"socket path {path} is longer than {MAX_PATH_BYTES} bytes")
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if accepts(path):
        raise OSError(f"cannot serve on {path}: another process accepts connections there")
    path.unlink()  # left by a process that was killed


def release(path: Path) -> None:
    """Remove the socket file (gRPC removes it when its server stops; a no-op then)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
