"""The sidecar's librdkafka configurations, built from its settings (no client is made here).

* :func:`fetch_config`: the fetch consumer's, in leased mode and, with the group's
  ``consumer_config``, in kafka_group mode (:func:`classic.classic_overrides`);
* :func:`reader_config`: ReadRange's consumers, under a group id of their own so a range
  read never moves the group's position;
* :func:`effective_config`: what ``Status`` shows, secrets masked.

The commit consumer is the runtime's plain group consumer (``new_consumer``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

from services.consumer_sidecar.classic import classic_overrides
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.consumer_config import SIDECAR_CONSUMER_DEFAULTS
from services.runtime.kafka import consumer_config

__all__ = ["SIDECAR_CONSUMER_DEFAULTS", "effective_config", "fetch_config", "reader_config"]

_SECRET_KEYS = ("password", "secret", "token", "key.pem")


def fetch_client_id(settings: SidecarSettings) -> str:
    return f"ds-sidecar-{settings.id}"


def fetch_config(
    settings: SidecarSettings,
    *,
    on_stats: Callable[[str], None],
    on_error: Callable[[KafkaError], None],
    group_config: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The fetch consumer's configuration. With ``group_config`` (kafka_group mode) the
    group's consumer_config and what that mode sets itself come on top."""
    overrides: dict[str, Any] = {
        **SIDECAR_CONSUMER_DEFAULTS,
        "statistics.interval.ms": settings.statistics_interval_ms,
        "stats_cb": on_stats,
    }
    if group_config is not None:
        overrides.update(classic_overrides(settings.id, group_config))
    return consumer_config(
        settings,
        group=settings.group,
        client_id=fetch_client_id(settings),
        overrides=overrides,
        error_cb=on_error,
    )


def reader_config(settings: SidecarSettings) -> dict[str, Any]:
    """Range readers: the sidecar's Kafka settings under a group id of their own."""
    return consumer_config(
        settings,
        group=f"{settings.group}.ds-reader",
        client_id=f"ds-sidecar-{settings.id}-reader",
    )


def effective_config(settings: SidecarSettings, *, kafka_group: bool) -> dict[str, str]:
    """The fetch consumer's configuration as Status shows it: values as strings, sorted,
    secrets masked, no callbacks."""
    overrides = dict(SIDECAR_CONSUMER_DEFAULTS)
    if kafka_group:
        overrides.update(classic_overrides(settings.id, {}))
    config: dict[str, Any] = consumer_config(
        settings,
        group=settings.group,
        client_id=fetch_client_id(settings),
        overrides=overrides,
    )
    config.pop("logger", None)
    return {
        key: ("***" if any(s in key for s in _SECRET_KEYS) else str(value))
        for key, value in sorted(config.items())
    }
