"""``HOST:PORT`` addresses as settings and discovery give them (pure; no pydantic, so the
connection module's leader watch can use it without pulling in the settings)."""

from __future__ import annotations

import re

_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def parse_host_port(value: str, *, what: str = "address") -> tuple[str, int]:
    """``host:port`` → (host, port), with a clear error for anything else."""
    match = _HOST_PORT.match(value.strip())
    if not match:
        raise ValueError(f"{what} {value!r} is not HOST:PORT")
    port = int(match.group(2))
    if not 0 < port < 65536:
        raise ValueError(f"{what} {value!r} has port {port} outside 1-65535")
    return match.group(1).strip("[]"), port
