"""A local webhook endpoint for the notifier's end-to-end tests (alert templates' webhooks):
an HTTP server on loopback, on a port of its own, that answers every POST with a status the
test sets (and may change while it runs) and keeps what it accepted."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Post:
    """One POST received: its headers (names lower-cased), body, and time.monotonic() then."""

    headers: dict[str, str]
    body: str
    at: float


def body_at_id(post: Post) -> tuple[str, float, str]:
    """What a Receiver keeps by default: (body, receive time, X-DS-Id)."""
    return post.body, post.at, post.headers.get("x-ds-id", "")


class Receiver(Generic[T]):
    """Answers each POST with ``status`` (changeable while running); keeps ``record`` of
    each POST it answers 2xx in ``received`` and counts the others in ``refused``."""

    def __init__(self, status: int, record: Callable[[Post], Any] = body_at_id) -> None:
        self.status = status
        self.received: list[T] = []
        self.refused = 0
        lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                at = time.monotonic()
                status = me.status
                headers = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    if 200 <= status < 300:
                        me.received.append(record(Post(headers, body.decode(), at)))
                    else:
                        me.refused += 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
