"""``ds-injector``'s HTTPS server: ``POST /inject`` answers AdmissionReviews (admission.py),
``GET /healthz`` and ``GET /metrics`` serve probes and Prometheus.

The stdlib's threaded HTTP server, with TLS added per connection: each accepted socket is
wrapped with the current certificate, and the certificate is re-read when its files change
(cert-manager rotates them in place), so a rotation needs no restart. The TLS handshake runs
on the connection's own thread, so a slow client cannot hold up accepting others.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from services.injector.admission import BadReview, answer
from services.injector.metrics import InjectorMetrics
from services.injector.template import SidecarTemplate

log = structlog.get_logger(__name__)

# The API server sends pods of a few KiB; an object is at most ~1.5 MiB in etcd.
MAX_BODY_BYTES = 4 * 1024 * 1024
# A connection that sends nothing for this long is closed (handshake and request alike).
CONNECTION_TIMEOUT_SECONDS = 10.0


class ReloadingCertificate:
    """An SSLContext for a certificate and key file pair, rebuilt when either file changes.
    A pair that fails to load (a rotation caught half-written) keeps the previous context
    and is tried again on the next connection."""

    def __init__(self, cert_file: Path, key_file: Path, metrics: InjectorMetrics) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._metrics = metrics
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._context: ssl.SSLContext | None = None
        self.context()  # fails at start when the files are unusable

    def _files_stamp(self) -> tuple[int, int] | None:
        try:
            return (self.cert_file.stat().st_mtime_ns, self.key_file.stat().st_mtime_ns)
        except OSError as exc:
            log.warning("certificate files unreadable; keeping the loaded ones", error=str(exc))
            return None

    def context(self) -> ssl.SSLContext:
        """The context for the files as they are now (reloaded if they changed)."""
        with self._lock:
            stamp = self._files_stamp()
            if stamp is not None and stamp != self._stamp:
                self._load(stamp)
            if self._context is None:
                raise ValueError(f"cannot load certificate {self.cert_file} / key {self.key_file}")
            return self._context

    def _load(self, stamp: tuple[int, int]) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            self._metrics.certificate_loads.labels(result="error").inc()
            log.error("certificate not loaded", cert=str(self.cert_file), error=str(exc))
            return
        first = self._context is None
        self._context, self._stamp = context, stamp
        self._metrics.certificate_loads.labels(result="ok").inc()
        log.info(
            "certificate loaded" if first else "certificate reloaded", cert=str(self.cert_file)
        )


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        certificate: ReloadingCertificate,
    ) -> None:
        self.certificate = certificate
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        wrapped = self.certificate.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that fails the handshake or hangs up is not the server's problem."""
        log.debug("connection failed", client=str(client_address))


def _handler(
    template: SidecarTemplate, metrics: InjectorMetrics, registry: CollectorRegistry
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the API server keeps connections open

        def setup(self) -> None:
            self.request.settimeout(CONNECTION_TIMEOUT_SECONDS)
            self.request.do_handshake()
            super().setup()

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(HTTPStatus.OK, b'{"status": "SERVING"}\n', "application/json")
            elif self.path == "/metrics":
                self._send(HTTPStatus.OK, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._refuse(HTTPStatus.NOT_FOUND, "not found")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/inject":
                self._refuse(HTTPStatus.NOT_FOUND, "not found")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._refuse(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
                return
            if not 0 < length <= MAX_BODY_BYTES:
                self._refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body empty or too large")
                return
            body = self.rfile.read(length)
            started = time.perf_counter()
            try:
                result = answer(json.loads(body), template)
            except (ValueError, BadReview) as exc:  # json.JSONDecodeError is a ValueError
                self._refuse(HTTPStatus.BAD_REQUEST, f"not an AdmissionReview v1: {exc}")
                return
            metrics.review_seconds.observe(time.perf_counter() - started)
            metrics.reviews.labels(action=result.action.value).inc()
            _log_review(result.review, result.action.value, result.reason)
            self._send(HTTPStatus.OK, json.dumps(result.review).encode(), "application/json")

        def _refuse(self, status: HTTPStatus, message: str) -> None:
            metrics.bad_requests.inc()
            self._send(status, f"{message}\n".encode(), "text/plain; charset=utf-8")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes and scrapes would flood the log; reviews are logged by _log_review."""

    return Handler


def _log_review(review: dict[str, Any], action: str, reason: str) -> None:
    log.info("admission review", uid=review["response"]["uid"], action=action, reason=reason)


class InjectorServer:
    """The webhook's HTTPS endpoint; ``start()`` serves on a thread, ``stop()`` ends it."""

    def __init__(
        self,
        host: str,
        port: int,
        certificate: ReloadingCertificate,
        template: SidecarTemplate,
        metrics: InjectorMetrics,
        registry: CollectorRegistry,
    ) -> None:
        self._server = _TlsServer((host, port), _handler(template, metrics, registry), certificate)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="https", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
