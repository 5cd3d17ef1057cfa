"""Free TCP ports on the loopback interface for locally started dev/test servers."""

from __future__ import annotations

import socket
from contextlib import ExitStack

LOOPBACK = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct ports that were free on 127.0.0.1 a moment ago.

    All sockets stay bound until every port is picked, so the kernel cannot hand the
    same port out twice; the ports are released on return, so a caller should bind them
    soon (another process could still grab one in between).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
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
