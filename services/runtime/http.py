"""The HTTP side of every service: ``/metrics`` (Prometheus), ``/healthz`` and extra pages.

A small threaded stdlib server is enough: scrapes and health probes are rare and cheap,
and keeping it off the asyncio loop means a busy loop never fails a liveness probe.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# A route gets the query parameters and returns a response; it runs on a server thread.
Route = Callable[[Mapping[str, list[str]]], HttpResponse]


def json_response(payload: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(status, json.dumps(payload, indent=2).encode(), "application/json")


class HttpEndpoint:
    """Serves /metrics from ``registry``, /healthz from ``health``, and extra routes."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, Mapping[str, Any]]],
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        all_routes: dict[str, Route] = {
            "/metrics": lambda _q: HttpResponse(
                200, generate_latest(registry), CONTENT_TYPE_LATEST
            ),
            "/healthz": lambda _q: _health_response(health),
        }
        all_routes.update(routes or {})
        handler = _make_handler(all_routes)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _health_response(health: Callable[[], tuple[bool, Mapping[str, Any]]]) -> HttpResponse:
    ok, detail = health()
    return json_response(
        {"status": "SERVING" if ok else "NOT_SERVING", **detail}, 200 if ok else 503
    )


def _make_handler(routes: Mapping[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            route = routes.get(url.path)
            if route is None:
                response = HttpResponse(HTTPStatus.NOT_FOUND, b"not found\n")
            else:
                try:
                    response = route(parse_qs(url.query))
                except Exception as exc:  # a broken page must not take the server down
                    response = HttpResponse(500, f"internal error: {exc}\n".encode())
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes every few seconds would flood the log; stay quiet."""

    return Handler
