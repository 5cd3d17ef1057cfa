"""Which target a client dials for a bound sidecar: its Unix domain socket or TCP (pure).

A sidecar in the application's pod also serves on a socket file in a volume both mount
(``SidecarEndpoint.local_address``, ``unix:PATH``; the file name carries the sidecar id).
Over it a call skips the TCP stack. The client prefers it when all of these hold:

* the binding names one (a ``unix:`` target);
* the client can be told there: it has no client certificate, or it sends a token (a
  socket carries no certificate, so a caller known only by its certificate would be
  refused ``UNAUTHENTICATED``; it stays on TCP);
* the socket is one nobody but its owner could have put there (a socket, in a directory
  neither its group nor other users may write: ``local_socket.untrusted``), so the token
  goes to the sidecar and nobody else;
* the socket file exists and accepts a connection now (in another pod there is no such
  file, so a client never reaches a sidecar that is not its pod's).

Otherwise it dials ``address`` (TCP). :class:`~dsclient.sidecar.Sidecar` falls back
to TCP when the socket fails later, and the next binding tries the socket again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dsclient.connection import TlsConfig
from dsclient.local_socket import path_of, usable


def sidecar_target(
    address: str,
    local_address: str,
    tls: TlsConfig,
    reachable: Callable[[Path], bool] = usable,
) -> str:
    """``local_address`` when the client should dial the socket (see the module), else
    ``address``. ``reachable`` (trusted and accepting) is asked last, and only for a
    ``unix:`` target."""
    path = path_of(local_address)
    if path is None:
        return address
    if tls.cert_file is not None and tls.token_file is None:
        return address  # known by its certificate only: it has no identity on the socket
    if not reachable(path):
        return address
    return local_address
