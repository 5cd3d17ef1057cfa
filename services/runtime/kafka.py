"""Kafka client factories: one place decides how every service talks to Kafka.

Consumers never auto-commit (commits are explicit and fenced, ARCHITECTURE §3); producers
are idempotent with ``acks=all``. librdkafka's own log lines go through the stdlib logger
``librdkafka`` instead of raw stderr, and its error callback is classified (§5.2).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from services.runtime.settings import ServiceSettings

log = structlog.get_logger(__name__)
_rdkafka_logger = logging.getLogger("librdkafka")

ErrorCallback = Callable[[KafkaError], None]


def _base(settings: ServiceSettings, client_id: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "client.id": client_id,
        # Follow broker leader changes quickly (error-driven refresh does the rest, §10).
        "topic.metadata.refresh.interval.ms": 30_000,
    }
    config.update(settings.kafka)
    return config


def consumer_config(
    settings: ServiceSettings,
    *,
    group: str,
    client_id: str,
    overrides: Mapping[str, Any] | None = None,
    error_cb: ErrorCallback | None = None,
) -> dict[str, Any]:
    config = _base(settings, client_id)
    config.update(
        {
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # librdkafka's log lines, served inside consume() on the calling thread.
            "logger": _rdkafka_logger,
        }
    )
    config.update(overrides or {})
    # Never let a passthrough turn auto-commit back on: fencing depends on explicit commits.
    config["enable.auto.commit"] = False
    if error_cb is not None:
        config["error_cb"] = error_cb
    return config


def new_consumer(
    settings: ServiceSettings,
    *,
    group: str,
    client_id: str,
    overrides: Mapping[str, Any] | None = None,
    error_cb: ErrorCallback | None = None,
) -> Consumer:
    return Consumer(
        consumer_config(
            settings, group=group, client_id=client_id, overrides=overrides, error_cb=error_cb
        )
    )


def new_producer(
    settings: ServiceSettings,
    *,
    client_id: str,
    overrides: Mapping[str, Any] | None = None,
    error_cb: ErrorCallback | None = None,
) -> Producer:
    config = _base(settings, client_id)
    config.update(
        {"enable.idempotence": True, "acks": "all", "linger.ms": 5, "logger": _rdkafka_logger}
    )
    config.update(overrides or {})
    if error_cb is not None:
        config["error_cb"] = error_cb
    return Producer(config)


def new_admin(settings: ServiceSettings, *, client_id: str) -> AdminClient:
    config = _base(settings, client_id)
    # No Python callbacks on an AdminClient: librdkafka may fire them from its own
    # threads, where confluent-kafka has no call state (seen here as a SIGSEGV in
    # rdk:main on a fresh broker; that crash was most likely librdkafka#5040, see
    # services/assigner/admin.py KafkaOffsets._committed). Its errors surface through
    # the calls' futures and the dependency probe; its own log lines stay in C, at error
    # level only.
    config["log_level"] = 3
    return AdminClient(config)


class KafkaProbe:
    """A dependency check: can we reach the cluster and read its metadata?"""

    name = "kafka"

    def __init__(
        self, settings: ServiceSettings, *, client_id: str, admin: AdminClient | None = None
    ) -> None:
        self._admin = admin or new_admin(settings, client_id=f"{client_id}-probe")
        self._bootstrap = settings.bootstrap

    async def check(self) -> None:
        await asyncio.to_thread(self._list_topics)

    def _list_topics(self) -> None:
        try:
            metadata = self._admin.list_topics(timeout=3)
        except KafkaException as exc:
            raise ConnectionError(f"Kafka at {self._bootstrap} unreachable: {exc}") from exc
        if not metadata.brokers:
            raise ConnectionError(f"Kafka at {self._bootstrap} reports no brokers")


class ErrorLogLimiter:
    """Says whether to log a librdkafka error: the first of each code, then at most one
    per ``interval`` seconds per code (a down broker raises the same error every retry)."""

    def __init__(self, interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[int, float] = {}
        self.suppressed: dict[int, int] = {}

    def should_log(self, error: KafkaError) -> bool:
        now = self.clock()
        code = int(error.code())
        last = self._last.get(code)
        if last is not None and now - last < self.interval:
            self.suppressed[code] = self.suppressed.get(code, 0) + 1
            return False
        self._last[code] = now
        return True

    def take_suppressed(self, error: KafkaError) -> int:
        return self.suppressed.pop(int(error.code()), 0)


def classify(error: KafkaError) -> str:
    """fatal | retriable | informational (ARCHITECTURE §5.2)."""
    if error.fatal():
        return "fatal"
    return "retriable" if is_retriable(error) else "informational"


def is_retriable(error: KafkaError) -> bool:
    """Whether librdkafka says an operation with this error may be retried."""
    return bool(error.retriable()) or error.code() in (
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    )
