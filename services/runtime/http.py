"""The HTTP side of every service: ``/metrics`` (Prometheus), ``/healthz`` and extra pages.

A small threaded stdlib server is enough: scrapes and health probes are rare and cheap,
and keeping it off the asyncio loop means a busy loop never fails a liveness probe.

With TLS configured every connection is wrapped with the current
:class:`~services.runtime.server_tls.HttpTls` context (reloaded when the certificate
changes; the handshake runs on the connection's own thread). With authorization on, the
extra pages (the assigner's ``/ui``) need the ``view`` permission (roles ``viewer`` or
``admin``), shown by a bearer token (``Authorization: Bearer``) or a client certificate:
401 without an identity, 403 without the permission. ``/metrics`` and ``/healthz`` stay
open to anyone who can connect: Prometheus and the probes carry no identity.
"""

from __future__ import annotations

import json
import selectors
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dsclient.connection.tls import TlsConfig
from dsclient.reasons import DsError, Reason
from services.runtime.auth import Guard, Permission, Verb
from services.runtime.auth.identity import bearer_token
from services.runtime.server_tls import HttpTls

OPEN_PATHS = frozenset({"/metrics", "/healthz"})


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# A route gets the query parameters and returns a response; it runs on a server thread.
Route = Callable[[Mapping[str, list[str]]], HttpResponse]


def json_response(payload: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, json.dumps(payload, indent=2).encode(), "application/json")


# Bounds on what a caller holds before it is known (issue 37, finding 11): a connection
# that sends nothing for this long is closed, and past this many open connections a new
# one is closed at once instead of taking a thread (scrapes and /ui need a handful).
HTTP_SOCKET_TIMEOUT_SECONDS = 10.0
HTTP_MAX_CONNECTIONS = 64


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int = HTTP_MAX_CONNECTIONS,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed at once, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HttpEndpoint:
    """Serves /metrics from ``registry``, /healthz from ``health``, and extra routes."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, Mapping[str, Any]]],
        routes: Mapping[str, Route] | None = None,
        *,
        tls: TlsConfig | None = None,
        guard: Guard | None = None,
        socket_timeout: float = HTTP_SOCKET_TIMEOUT_SECONDS,
        max_connections: int = HTTP_MAX_CONNECTIONS,
    ) -> None:
        all_routes: dict[str, Route] = {
            "/metrics": lambda _q: HttpResponse(
                200, generate_latest(registry), CONTENT_TYPE_LATEST
            ),
            "/healthz": lambda _q: _health_response(health),
        }
        all_routes.update(routes or {})
        handler = _make_handler(all_routes, guard, socket_timeout)
        self._server = (
            _BoundedServer((host, port), handler, max_connections)
            if tls is None
            else _TlsHttpServer((host, port), handler, HttpTls(tls), max_connections)
        )
        self._server.daemon_threads = True
        # stop() writes a byte here: the serving thread sleeps until a connection or this,
        # where serve_forever() looked at its shutdown flag every 0.5 s (issue 34).
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(
            target=_serve_until, args=(self._server, self._stop_r), name="http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The thread that accepts connections (each request has a thread of its own)."""
        return self._thread

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop_w.send(b"x")
            self._thread.join()
        self._server.server_close()
        self._stop_r.close()
        self._stop_w.close()


def _serve_until(server: ThreadingHTTPServer, stop: socket.socket) -> None:
    """``server.serve_forever()`` without its poll: handles connections until ``stop`` is
    readable, and sleeps in between."""
    with selectors.DefaultSelector() as selector:
        selector.register(server, selectors.EVENT_READ)
        selector.register(stop, selectors.EVENT_READ)
        while True:
            ready = [key.fileobj for key, _ in selector.select()]
            if stop in ready:
                return
            server.handle_request()  # readable: accepts at once, a thread serves it
            server.service_actions()


def _health_response(health: Callable[[], tuple[bool, Mapping[str, Any]]]) -> HttpResponse:
    ok, detail = health()
    return json_response(
        {"status": "SERVING" if ok else "NOT_SERVING", **detail}, 200 if ok else 503
    )


class _TlsHttpServer(_BoundedServer):
    """Wraps each accepted connection in TLS; the handshake happens on the handler's
    thread (on its first read), so a slow or silent client never blocks accepting."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: HttpTls,
        max_connections: int = HTTP_MAX_CONNECTIONS,
    ) -> None:
        self._tls = tls
        super().__init__(address, handler, max_connections)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        wrapped = self._tls.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake (a plaintext client, an untrusted certificate) is the client's
        problem: no traceback on stderr."""


def _peer_certificate_name(connection: Any) -> str | None:
    if not isinstance(connection, ssl.SSLSocket):
        return None
    certificate: Any = connection.getpeercert() or {}
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _guarded(guard: Guard | None, path: str, headers: Any, connection: Any) -> HttpResponse | None:
    """The refusal of a request for a protected page, or None to serve it."""
    if guard is None or path in OPEN_PATHS:
        return None
    authorization = headers.get("Authorization")
    token = bearer_token([("authorization", authorization)]) if authorization else None
    try:
        guard.check(
            f"GET {path}",
            token,
            _peer_certificate_name(connection),
            Permission(Verb.VIEW),
        )
    except DsError as err:
        status = 401 if err.reason is Reason.UNAUTHENTICATED else 403
        return HttpResponse(status, f"{err.message}\n".encode())
    return None


def _make_handler(
    routes: Mapping[str, Route],
    guard: Guard | None = None,
    socket_timeout: float = HTTP_SOCKET_TIMEOUT_SECONDS,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = socket_timeout  # an idle or slow connection is closed (and its thread)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            route = routes.get(url.path)
            refusal = _guarded(guard, url.path, self.headers, self.connection) if route else None
            if route is None:
                response = HttpResponse(HTTPStatus.NOT_FOUND, b"not found\n")
            elif refusal is not None:
                response = refusal
            else:
                try:
                    response = route(parse_qs(url.query))
                except Exception as exc:  # a broken page must not take the server down
                    response = HttpResponse(500, f"internal error: {exc}\n".encode())
            self.send_response(response.status)
            if response.status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="dataservice"')
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes every few seconds would flood the log; stay quiet."""

    return Handler
