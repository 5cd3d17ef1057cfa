"""The sidecar's librdkafka configurations, built from its settings (no client is made here).

* :func:`fetch_config`: the fetch consumer's: the sidecar's settings, its defaults
  (:data:`SIDECAR_CONSUMER_DEFAULTS`), then the group's ``consumer_config`` on top (in both
  modes), and in kafka_group mode what that mode sets itself
  (:func:`classic.classic_overrides`), in leased mode ``auto.offset.reset=error``
  (:data:`LEASED_OVERRIDES`; :func:`resets_to_end` says which way the fetch loop moves);
* :func:`reader_config`: ReadRange's consumers, under a group id of their own so a range
  read never moves the group's position;
* :func:`shown_config`: a configuration as ``Status`` shows it, secrets masked.

The commit consumer is the runtime's plain group consumer (``new_consumer``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

from services.consumer_sidecar.kafka_group_membership import classic_overrides
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.consumer_config import ALLOWED, SIDECAR_CONSUMER_DEFAULTS
from services.runtime.kafka import consumer_config

__all__ = [
    "LEASED_OVERRIDES",
    "SIDECAR_CONSUMER_DEFAULTS",
    "fetch_config",
    "reader_config",
    "resets_to_end",
    "shown_config",
]

# Leased mode: a position outside the partition's log is an error for the fetch loop to
# handle (Fetcher._out_of_range: counted, reported, moved), never a silent jump. Set after
# the group's consumer_config, whose auto.offset.reset only says which way the move goes.
LEASED_OVERRIDES: dict[str, object] = {"auto.offset.reset": "error"}
_SECRET_KEYS = ("password", "secret", "token", "key.pem", "jaas", "credential")
# Every SASL value but the mechanism is a credential or names the principal
# (sasl.oauthbearer.config and .extensions carry client secrets): Status shows none of
# them to the group's readers (issue 37, finding 12).
_SHOWN_SASL = frozenset({"sasl.mechanism", "sasl.mechanisms"})
_CALLBACKS = ("stats_cb", "error_cb", "logger")
_TO_END = frozenset({"latest", "largest", "end"})


def resets_to_end(settings: SidecarSettings, group_config: Mapping[str, str] | None = None) -> bool:
    """Whether a leased partition's position that fell outside its log goes on from the
    log's end (``auto.offset.reset`` says latest: the group's consumer_config, else the
    sidecar's passthrough) rather than its start."""
    group = {k: v for k, v in (group_config or {}).items() if k in ALLOWED}
    reset = group.get("auto.offset.reset", settings.kafka.get("auto.offset.reset", "earliest"))
    return str(reset).lower() in _TO_END


def fetch_client_id(settings: SidecarSettings) -> str:
    return f"ds-sidecar-{settings.id}"


def fetch_config(
    settings: SidecarSettings,
    *,
    on_stats: Callable[[str], None] | None = None,
    on_error: Callable[[KafkaError], None] | None = None,
    group_config: Mapping[str, str] | None = None,
    kafka_group: bool = False,
) -> dict[str, Any]:
    """The fetch consumer's configuration: the group's ``group_config`` on top of the
    sidecar's defaults; in kafka_group mode what that mode sets itself comes last. Only
    allow-listed properties of ``group_config`` are used: the assigner refuses others, and a
    record written before the allow-list existed must not reach librdkafka either."""
    overrides: dict[str, Any] = {
        **SIDECAR_CONSUMER_DEFAULTS,
        "statistics.interval.ms": settings.statistics_interval_ms,
    }
    if on_stats is not None:
        overrides["stats_cb"] = on_stats
    allowed = {k: v for k, v in (group_config or {}).items() if k in ALLOWED}
    if kafka_group:
        overrides.update(classic_overrides(settings.id, allowed))
    else:
        overrides.update(allowed)
        overrides.update(LEASED_OVERRIDES)
    return consumer_config(
        settings,
        group=settings.group,
        client_id=fetch_client_id(settings),
        overrides=overrides,
        error_cb=on_error,
    )


READER_FETCH_WAIT_MS = 10


def reader_config(settings: SidecarSettings) -> dict[str, Any]:
    """Range readers: the sidecar's Kafka settings under a group id of their own, their
    prefetch bounded by ``read_range_prefetch_bytes`` (half queued, half one fetch
    response), which is what each stream reserves from the buffer cap for it."""
    half = settings.read_range_prefetch_bytes // 2
    return consumer_config(
        settings,
        group=f"{settings.group}.ds-reader",
        client_id=f"ds-sidecar-{settings.id}-reader",
        overrides={
            "queued.max.messages.kbytes": half // 1024,
            "fetch.max.bytes": half,
            # A range ends at or below the high watermark, so a fetch has nothing to wait
            # for; and a pooled reader's next assignment waits for the fetch in flight when
            # the last read ended (librdkafka's default 500 ms made a reused consumer 3x
            # slower than a new one in bench_range_reads.py).
            "fetch.wait.max.ms": READER_FETCH_WAIT_MS,
        },
    )


def shown_config(config: Mapping[str, Any]) -> dict[str, str]:
    """A consumer configuration as Status shows it: values as strings, sorted, secrets
    and every ``sasl.*`` value but the mechanism masked, no callbacks."""
    return {
        key: ("***" if _is_secret(key) else str(value))
        for key, value in sorted(config.items())
        if key not in _CALLBACKS
    }


def _is_secret(key: str) -> bool:
    if key.startswith("sasl.") and key not in _SHOWN_SASL:
        return True
    return any(s in key for s in _SECRET_KEYS)
