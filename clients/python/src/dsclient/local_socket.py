"""A service's gRPC port on a Unix domain socket, for callers in its own pod.

The sidecar and its application share a pod: over a socket file in a volume both mount,
a call skips the TCP stack (and TLS, see below). The socket is served with gRPC's *local*
credentials (:func:`grpc.local_server_credentials`): no handshake on the wire, so a
plaintext client reaches it too, and a client's per-call credentials (the bearer token)
may be sent over it, which gRPC refuses on a plaintext channel. TLS is skipped (the
connection never leaves the kernel, and only processes that can open the file reach it:
mode 0660 in a directory only the sidecar writes, mode 0750, inside the volume the pod's
containers share); the authorization interceptor
is not: every call on the socket is authenticated and authorized like one on TCP. A
caller known only by its client certificate has none on the socket, so it is refused
there (``UNAUTHENTICATED``): such a client stays on TCP (``dsclient.binding``).

A client sends its token over a socket only when nobody but the socket's owner could have
put it there (:func:`untrusted`, issue 37, finding 1): the file is a socket, not a link,
not writable by every user, in a directory (not a link) that neither its group nor other
users may write, owned by root, the client's user or the socket's owner. Otherwise anyone
who can write the directory (a world-writable ``/tmp``, a group-writable volume) could put
a listener of their own there and collect the tokens sent to it; the client dials TCP,
where TLS checks who answers.

The file is claimed at start (a stale one, left by a killed process, is replaced; one a
live process answers on is an error, never taken over) and removed on stop.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

SCHEME = "unix:"
SOCKET_MODE = 0o660
# The directory the socket and the segments live in: written by the sidecar only, entered
# by the pod's group (issue 37, finding 12).
DIRECTORY_MODE = 0o750
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


def sidecar_directory_name(sidecar_id: str) -> str:
    """The sidecar's own directory inside the shared volume: ``sidecar-ID.d``."""
    return f"sidecar-{sidecar_id}.d"


def untrusted(path: Path) -> str | None:
    """Why a client must not send its token to the socket ``path`` (see the module); None
    when it may. Reads the file's and its directory's metadata only (``lstat``)."""
    try:
        file = path.lstat()
        directory = path.parent.lstat()
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISSOCK(file.st_mode):
        return f"{path} is not a socket"
    if file.st_mode & stat.S_IWOTH:
        return f"{path} is writable by every user"
    if not stat.S_ISDIR(directory.st_mode):
        return f"{path.parent} is not a directory"
    if directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{path.parent} is writable by users other than its owner "
            f"(mode {stat.S_IMODE(directory.st_mode):o})"
        )
    trusted = {0, os.geteuid(), file.st_uid}
    if directory.st_uid not in trusted or file.st_uid not in {0, os.geteuid(), directory.st_uid}:
        return f"{path} and {path.parent} are owned by users {file.st_uid}, {directory.st_uid}"
    return None


def usable(path: Path) -> bool:
    """Whether a client sends its calls to the socket ``path``: trusted and accepting now."""
    return untrusted(path) is None and accepts(path)


def make_directory(path: Path) -> None:
    """Create the sidecar's own directory (mode 0750, whatever the umask) in the shared
    volume, or take over the one a previous run of it left; OSError if the path is a link,
    not a directory, or another user's."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=DIRECTORY_MODE, parents=False)
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise OSError(f"{path} is not a directory of this user: will not serve there")
    path.chmod(DIRECTORY_MODE)


def sidecar_file_name(sidecar_id: str) -> str:
    """The file name of a sidecar's socket: ``sidecar-ID.sock``."""
    return f"sidecar-{sidecar_id}.sock"


def segment_prefix(sidecar_id: str) -> str:
    """The file names of a sidecar's shared-memory segments (``DELIVERY_FORMAT_ARROW_SHM``,
    beside its socket) begin with this: ``sidecar-ID.shm-``."""
    return f"sidecar-{sidecar_id}.shm-"


def frame_socket_name(sidecar_id: str) -> str:
    """The sidecar's frame socket beside its gRPC socket (``StreamOpen.frame_socket``):
    ``sidecar-ID.frames``."""
    return f"sidecar-{sidecar_id}.frames"


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
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        make_directory(path.parent)
        return
    make_directory(path.parent)
    if accepts(path):
        raise OSError(f"cannot serve on {path}: another process accepts connections there")
    path.unlink()  # left by a process that was killed


def release(path: Path) -> None:
    """Remove the socket file (gRPC removes it when its server stops; a no-op then)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
