"""Per-group consumer properties as librdkafka judges them: unknown names, bad values.

Not pure (a C call), so apart from :mod:`.validation`; it connects nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException

from services.runtime.errors import DsError, Reason


def check_librdkafka_properties(field: str, config: Mapping[str, str]) -> None:
    """Unknown properties and bad values, as librdkafka judges them. Builds (and closes) a
    consumer that connects nowhere: a few milliseconds, but a C call — run it in a thread."""
    try:
        Consumer({**config, "group.id": "ds-assigner-config-check", "log_level": 0}).close()
    except KafkaException as exc:
        err = exc.args[0]
        text = err.str() if hasattr(err, "str") else str(exc)
        key = next((k for k in sorted(config) if f'"{k}"' in text or f"`{k}`" in text), "")
        raise DsError(
            Reason.INVALID_FIELD,
            f"{field}: {text}",
            metadata={"field": field, "key": key} if key else {"field": field},
        ) from exc
