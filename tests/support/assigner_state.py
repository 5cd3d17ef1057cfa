"""An assigner's own state topic and transactional id, for e2e tests on a shared broker
(another test's assigner under the default transactional id would fence this one's state
writes). The ``own_state`` fixture (tests/e2e/conftest.py) hands it out."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka.admin import AdminClient


@contextmanager
def own_state(bootstrap: str) -> Iterator[dict[str, str]]:
    """The assigner environment naming a state topic and transactional id of its own; the
    topic deleted afterwards (gone, or never created: either is fine)."""
    unique = uuid.uuid4().hex[:8]
    state_topic = f"__ds_assigner_state.test-{unique}"
    try:
        yield {"DS_STATE_TOPIC": state_topic, "DS_STATE_TRANSACTIONAL_ID": f"ds-state-{unique}"}
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics([state_topic]).values():
            future.exception(timeout=30)
