"""Per-group consumer properties as librdkafka judges them: unknown names, bad values.

Not pure (a C call), so apart from :mod:`.validation`; it connects nowhere. Call it only for
a config that passed the allow-list (:func:`.validation.validate_consumer_config`).
"""

from __future__ import annotations

from collections.abc import Mapping

from services.assigner.admin.validation import consumer_config_error
from services.runtime.consumer_config import ConsumerConfigError, check_librdkafka


def check_librdkafka_properties(field: str, config: Mapping[str, str]) -> None:
    """Unknown properties and bad values, as librdkafka judges them on top of the sidecar's
    own defaults (what a sidecar builds): builds (and closes) a consumer that connects
    nowhere. A few milliseconds, but a C call: run it in a thread."""
    try:
        check_librdkafka(config)
    except ConsumerConfigError as err:
        raise consumer_config_error(field, err) from None
