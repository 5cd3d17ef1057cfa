"""Refused calls: counted per identity, logged at most once per identity per minute.

A caller that is refused usually retries (a misconfigured client, a probe, an attacker):
every refusal is counted (``ds_auth_refusals_total{identity, code}``) but only the first
of each minute is logged per identity, so a loop of refusals cannot flood the log.
Unauthenticated callers count under the identity ``-``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry, Counter

log = structlog.get_logger(__name__)

LOG_INTERVAL_SECONDS = 60.0
# Identities remembered for the log limit; past this the oldest are forgotten.
MAX_REMEMBERED = 10_000
UNKNOWN = "-"


class LogLimiter:
    """Whether to log now for a key: once per ``interval`` per key (pure but for the lock)."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS, limit: int = MAX_REMEMBERED):
        self._interval = interval
        self._limit = limit
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, now: float) -> int | None:
        """How many were suppressed since the last logged one, if this one is to be
        logged; None: suppress it."""
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            if last is None and len(self._last) >= self._limit:
                oldest = min(self._last, key=self._last.__getitem__)
                del self._last[oldest]
                self._suppressed.pop(oldest, None)
            self._last[key] = now
            return self._suppressed.pop(key, 0)


class Refusals:
    """Counts and logs the calls the authorization interceptor refuses."""

    def __init__(
        self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.counter = Counter(
            "ds_auth_refusals",
            "Calls refused by authentication or authorization, by caller identity",
            ["identity", "code"],
            registry=registry,
        )
        self._limiter = LogLimiter()
        self._clock = clock

    def refused(self, identity: str | None, code: str, method: str, why: str) -> None:
        who = identity or UNKNOWN
        self.counter.labels(who, code).inc()
        suppressed = self._limiter.admit(who, self._clock())
        if suppressed is not None:
            log.warning(
                "call refused",
                identity=who,
                code=code,
                rpc=method,
                why=why,
                suppressed_since_last=suppressed,
            )
