"""Free TCP ports on the loopback interface for locally started dev/test servers."""

from __future__ import annotations

import socket
import threading
from contextlib import ExitStack

LOOPBACK = "127.0.0.1"


# Every port this process has handed out: never handed out again. Two calls made one after
# the other could otherwise get the same port back from the kernel once the first was
# released and not bound yet (CI's run of 27 Nov started two sidecars on one port).
_HANDED_OUT: set[int] = set()
_LOCK = threading.Lock()


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct ports that were free on 127.0.0.1 a moment ago, none of them
    handed out by this process before.

    All sockets stay bound until every port is picked, so the kernel cannot hand the
    same port out twice within a call, and the process remembers what it handed out, so
    neither across calls; the ports are released on return, so a caller should bind them
    soon (another process could still grab one in between).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with _LOCK, ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:  # else keep it bound and pick another
                ports.append(port)
        _HANDED_OUT.update(ports)
        return ports


def free_port() -> int:
    """Return one port that was free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def port_is_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
