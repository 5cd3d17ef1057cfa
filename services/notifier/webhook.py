"""One webhook POST to an address the egress policy checked (``egress.py``).

The connection goes to that address, not to whatever the host name resolves to by then
(no DNS-rebinding window), while ``Host``, TLS's server name and certificate check use the
URL's host. ``http.client`` follows no redirect: a 3xx is the answer.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Sequence

from services.notifier.egress import Target


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, target: Target, address: str, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(
        self, target: Target, address: str, timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(target.host, target.port, timeout=timeout, context=context)
        self._address = address
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def post(
    target: Target,
    addresses: Sequence[str],
    body: bytes,
    headers: Sequence[tuple[str, str]],
    *,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> int:
    """POST ``body`` to ``target`` at the first of ``addresses`` that accepts a
    connection; returns the HTTP status (redirects are not followed). Raises OSError when
    none can be reached or the exchange fails."""
    last: OSError | None = None
    for address in addresses:
        connection: http.client.HTTPConnection
        if target.is_tls:
            tls = context or ssl.create_default_context()
            connection = _PinnedHTTPSConnection(target, address, timeout, tls)
        else:
            connection = _PinnedHTTPConnection(target, address, timeout)
        try:
            connection.request("POST", target.path, body=body, headers=dict(headers))
            response = connection.getresponse()
            response.read(64 * 1024)  # drain what we will not look at, up to a bound
            return int(response.status)
        except (TimeoutError, ConnectionRefusedError) as exc:
            last = exc  # try the next address
        except http.client.HTTPException as exc:
            raise OSError(f"bad HTTP answer: {exc!r}") from exc
        finally:
            connection.close()
    raise last or OSError("no address to connect to")
