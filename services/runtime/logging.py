"""structlog set-up: JSON lines in production, a readable console in development.

Only entry points call :func:`configure`; library modules just ``structlog.get_logger()``
and bind context (``group``, ``topic``, ``partition``, ``client_id``, ``rpc``).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def configure(
    service: str,
    *,
    fmt: Literal["json", "console"] = "json",
    level: str = "info",
) -> None:
    """Configure structlog and the stdlib root logger (used by grpc, kazoo-style libs)."""
    numeric = _LEVELS.get(level, logging.ERROR if level == "error" else logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    # librdkafka repeats every connection failure on each reconnect; the services report the
    # same errors, classified and rate-limited, through their error callbacks instead.
    logging.getLogger("librdkafka").setLevel(
        logging.DEBUG if level == "debug" else logging.CRITICAL
    )
