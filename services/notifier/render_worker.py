"""Alert templates render in a child process, with a time, output-size and memory limit.

A template is code a caller wrote: ``{% for a in range(100000) %}{% for b in
range(100000) %}{% endfor %}{% endfor %}`` never ends and no check inside Python can stop
it; a filter can allocate gigabytes. So rendering runs in one spawned worker process
(``RLIMIT_AS`` set to the memory limit), which the notifier kills and replaces when a
render passes the time limit. The caller of :meth:`RenderWorker.render` (the render relay
and PutAlertTemplate's trial render, never the Kafka relay) waits at most that long.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from services.notifier.sandbox import LimitedSandbox, OutputTooLarge, render_limited

log = structlog.get_logger(__name__)
STARTUP_SECONDS = 60.0


@dataclass(frozen=True)
class RenderLimits:
    timeout_seconds: float = 1.0
    max_bytes: int = 64 * 1024
    memory_bytes: int = 512 * 1024 * 1024


class LimitExceeded(Exception):
    """A render passed a limit: ``limit`` is ``time``, ``size`` or ``memory``."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message


class TemplateError(Exception):
    """The template failed as templates do (a sandbox violation, a bad filter call): the
    alert carries the error, the template stays enabled."""


def _serve(conn: multiprocessing.connection.Connection, limits: RenderLimits) -> None:
    """The worker: render what comes down the pipe, answer (kind, text), until EOF."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on Linux
        pass
    env = LimitedSandbox(limits.max_bytes)
    conn.send(("ready", ""))
    while True:
        try:
            text, variables = conn.recv()
        except EOFError:
            return
        try:
            answer = ("ok", render_limited(env, text, variables))
        except OutputTooLarge as exc:
            answer = ("size", str(exc))
        except MemoryError:
            answer = ("memory", f"rendering needed more than {limits.memory_bytes} bytes")
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(answer)


class RenderWorker:
    """One render at a time in a child process; thread-safe. Started on first use."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._context = multiprocessing.get_context("spawn")  # never fork a threaded process
        self._process: Any = None
        self._conn: multiprocessing.connection.Connection | None = None

    def render(self, text: str, variables: Mapping[str, Any]) -> str:
        """The rendered text. :class:`LimitExceeded` past a limit (the worker is replaced
        after a timeout or a crash), :class:`TemplateError` for a template's own error."""
        with self._lock:
            conn = self._ensure()
            conn.send((text, dict(variables)))
            if not conn.poll(self.limits.timeout_seconds):
                self._kill()
                raise LimitExceeded(
                    "time", f"rendering took longer than {self.limits.timeout_seconds:g} s"
                )
            try:
                kind, result = conn.recv()
            except (EOFError, OSError):
                self._kill()  # the worker died: out of memory, most likely
                raise LimitExceeded(
                    "memory", f"the render worker died (memory limit {self.limits.memory_bytes})"
                ) from None
        if kind == "ok":
            return str(result)
        if kind in ("size", "memory"):
            raise LimitExceeded(kind, str(result))
        raise TemplateError(str(result))

    def _ensure(self) -> multiprocessing.connection.Connection:
        if self._conn is None or self._process is None or not self._process.is_alive():
            self._kill()
            parent, child = self._context.Pipe()
            process = self._context.Process(
                target=_serve, args=(child, self.limits), name="ds-render", daemon=True
            )
            process.start()
            child.close()
            self._process, self._conn = process, parent
            # Starting (imports) is not rendering: it does not count against the limit.
            if not parent.poll(STARTUP_SECONDS) or parent.recv() != ("ready", ""):
                self._kill()
                raise RuntimeError(f"the render worker did not start in {STARTUP_SECONDS} s")
        return self._conn

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def close(self) -> None:
        with self._lock:
            self._kill()
