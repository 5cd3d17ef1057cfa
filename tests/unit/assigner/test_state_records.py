"""Folding state-topic records into a snapshot: drains are kept and ended like bindings."""

from __future__ import annotations

import json

from services.assigner.state import StateSnapshot, apply_record


def key(*parts: str) -> bytes:
    return json.dumps(list(parts), separators=(",", ":")).encode()


def test_a_drain_survives_a_restart_until_undrained() -> None:
    snapshot = StateSnapshot()
    apply_record(snapshot, key("drain", "g", "sc-1"), b'{"drained":true}')
    apply_record(snapshot, key("drain", "g", "sc-2"), b'{"drained":true}')
    assert snapshot.drained == {"g": {"sc-1", "sc-2"}}
    apply_record(snapshot, key("drain", "g", "sc-1"), None)  # the undrain's tombstone
    assert snapshot.drained == {"g": {"sc-2"}}
    assert snapshot.records == 3
