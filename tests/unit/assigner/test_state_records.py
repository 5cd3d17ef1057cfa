"""Folding ``__ds_assigner_state`` records into a snapshot: drains are kept and ended like
bindings; records that do not parse are counted and skipped.

Anything can be written to the topic by hand (or by a buggy or newer writer): a key that
is not JSON, a readable key whose value is not JSON or lacks fields, a ``null`` value
under an epoch key. None of it may raise (that would stop loading, and with it
leadership) or be applied: a tombstone for an epoch would let the epoch go backwards. A
tombstone for a group is DeleteGroup's: the group, its bindings and drains go, its epochs
stay.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.assigner.state import GroupRecord, StateSnapshot, apply_record
from services.runtime.topic_partition import TP


def key(*parts: object) -> bytes:
    return json.dumps(list(parts)).encode()


def good_group(name: str = "g") -> bytes:
    return json.dumps(GroupRecord(name=name, topics=["t"]).to_json()).encode()


def loaded() -> StateSnapshot:
    snapshot = StateSnapshot()
    apply_record(snapshot, key("group", "g"), good_group())
    apply_record(snapshot, key("epoch", "g", "t", 0), b'{"epoch": 7}')
    apply_record(snapshot, key("binding", "g", "c1"), b'{"bound":true}')
    return snapshot


@pytest.mark.parametrize(
    ("record_key", "value", "kind"),
    [
        (b"\xff not json", b"{}", "unknown"),
        (b"", b"{}", "unknown"),
        (b'"group"', good_group(), "unknown"),  # JSON, but not a list
        (b"[]", b"{}", "unknown"),
        (b"42", b"{}", "unknown"),
        (key("bogus", "g"), b"{}", "unknown"),
        (key("group"), good_group(), "group"),  # the name is missing
        (key("group", 3), good_group(), "group"),
        (key("group", "g"), b"not json", "group"),
        (key("group", "g"), b"[1, 2]", "group"),
        (key("group", "g"), b'{"name": "g"}', "group"),  # lacks topics
        (key("group", "g"), b'{"name": "g", "topics": "t"}', "group"),
        (key("group", "g"), b'{"name": "g", "topics": []}', "group"),
        (key("group", "g"), b'{"name": "g", "topics": ["t"], "mode": "bogus"}', "group"),
        (
            key("group", "g"),
            b'{"name": "g", "topics": ["t"], "balance_strategy": "fastest"}',
            "group",
        ),
        (
            key("group", "g"),
            b'{"name": "g", "topics": ["t"], "consumer_config": {"a": 1}}',
            "group",
        ),
        (key("group", "g"), b'{"name": "g", "topics": ["t"], "config_version": "2"}', "group"),
        (key("group", "g"), b'{"name": "g", "topics": ["t"], "config_version": 0}', "group"),
        (key("group", "g"), good_group("other"), "group"),  # the value names another group
        (key("epoch", "g", "t", 0), None, "epoch"),  # an epoch never goes back to nothing
        (key("epoch", "g", "t", 0), b"{}", "epoch"),
        (key("epoch", "g", "t", 0), b'{"epoch": "9"}', "epoch"),
        (key("epoch", "g", "t", 0), b'{"epoch": -1}', "epoch"),
        (key("epoch", "g", "t", 0), b'{"epoch": true}', "epoch"),
        (key("epoch", "g", "t", "zero"), b'{"epoch": 9}', "epoch"),
        (key("epoch", "g", "t", -1), b'{"epoch": 9}', "epoch"),
        (key("epoch", "g", 5, 0), b'{"epoch": 9}', "epoch"),
        (key("binding", "g", "c1"), b"not json", "binding"),
        (key("binding", "g", 7), b'{"bound":true}', "binding"),
        (key("drain", "g"), b'{"drained":true}', "drain"),
        (key("drain", "g", "sc-1"), b"not json", "drain"),
    ],
)
def test_a_bad_record_is_counted_and_changes_nothing(
    record_key: bytes, value: bytes | None, kind: str
) -> None:
    snapshot = loaded()
    before = (dict(snapshot.groups), dict(snapshot.epochs["g"]), set(snapshot.bindings["g"]))
    apply_record(snapshot, record_key, value)
    assert snapshot.bad_records == {kind: 1}
    assert (dict(snapshot.groups), dict(snapshot.epochs["g"]), set(snapshot.bindings["g"])) == (
        before
    )


def test_good_records_still_apply() -> None:
    snapshot = loaded()
    assert snapshot.groups["g"] == GroupRecord(name="g", topics=["t"])
    assert snapshot.epochs == {"g": {TP("t", 0): 7}}
    assert snapshot.bindings == {"g": {"c1"}}
    assert snapshot.bad_records == {}
    apply_record(snapshot, key("binding", "g", "c1"), None)  # unbinding is a tombstone
    apply_record(snapshot, key("epoch", "g", "t", 0), b'{"epoch": 3}')  # never lowers
    assert snapshot.bindings == {"g": set()}
    assert snapshot.epochs == {"g": {TP("t", 0): 7}}
    assert snapshot.records == 5
    assert snapshot.bad_records == {}


def test_a_group_record_with_fields_this_version_does_not_know_is_read() -> None:
    """A newer assigner may add fields: the ones this version knows are kept."""
    snapshot = StateSnapshot()
    value = {**GroupRecord(name="g", topics=["t"]).to_json(), "future_field": {"x": 1}}
    apply_record(snapshot, key("group", "g"), json.dumps(value).encode())
    assert snapshot.groups["g"] == GroupRecord(name="g", topics=["t"])
    assert snapshot.bad_records == {}


@pytest.mark.parametrize("fencing", ["", "lease", "kafka"])
def test_a_group_records_commit_fencing_round_trips(fencing: str) -> None:
    """commit_fencing (issue 36): written only when set, read back as written; an unknown
    value is a bad record."""
    record = GroupRecord(name="g", topics=["t"], commit_fencing=fencing)
    document = record.to_json()
    assert ("commit_fencing" in document) == bool(fencing)
    snapshot = StateSnapshot()
    apply_record(snapshot, key("group", "g"), json.dumps(document).encode())
    assert snapshot.groups["g"] == record
    assert snapshot.groups["g"].commit_fencing == fencing
    apply_record(
        snapshot, key("group", "h"), json.dumps({**document, "commit_fencing": "time"}).encode()
    )
    assert "h" not in snapshot.groups
    assert snapshot.bad_records == {"group": 1}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=6,
)
_keys = st.one_of(
    st.binary(max_size=64),
    _json.map(lambda v: json.dumps(v).encode()),
    st.tuples(
        st.sampled_from(["group", "epoch", "binding", "drain"]), st.lists(_json, max_size=4)
    ).map(lambda kv: json.dumps([kv[0], *kv[1]]).encode()),
)
_values = st.one_of(st.none(), st.binary(max_size=64), _json.map(lambda v: json.dumps(v).encode()))


@given(records=st.lists(st.tuples(_keys, _values), max_size=20))
def test_no_record_raises_and_every_one_is_counted(
    records: list[tuple[bytes, bytes | None]],
) -> None:
    """Whatever is in the topic, loading goes on: each record is applied or counted bad,
    and what was loaded before stays a valid state (epochs never lowered)."""
    snapshot = loaded()
    for record_key, value in records:
        apply_record(snapshot, record_key, value)
    assert snapshot.records + sum(snapshot.bad_records.values()) == 3 + len(records)
    assert snapshot.epochs["g"][TP("t", 0)] >= 7
    for name, group in snapshot.groups.items():
        assert group.name == name
        assert group.topics and all(isinstance(t, str) for t in group.topics)
        assert group.mode in ("leased", "kafka_group")
        assert group.balance_strategy in ("count", "load")
    assert "g" in snapshot.groups


def test_a_drain_survives_a_restart_until_undrained() -> None:
    snapshot = StateSnapshot()
    apply_record(snapshot, key("drain", "g", "sc-1"), b'{"drained":true}')
    apply_record(snapshot, key("drain", "g", "sc-2"), b'{"drained":true}')
    assert snapshot.drained == {"g": {"sc-1", "sc-2"}}
    apply_record(snapshot, key("drain", "g", "sc-1"), None)  # the undrain's tombstone
    assert snapshot.drained == {"g": {"sc-2"}}
    assert snapshot.records == 3


def test_a_deleted_group_goes_with_its_bindings_and_drains_but_keeps_its_epochs() -> None:
    snapshot = loaded()
    apply_record(snapshot, key("drain", "g", "sc-1"), b'{"drained":true}')
    apply_record(snapshot, key("group", "g"), None)  # DeleteGroup's tombstone
    assert snapshot.groups == {}
    assert snapshot.bindings == {}
    assert snapshot.drained == {}
    assert snapshot.epochs == {"g": {TP("t", 0): 7}}  # an epoch never goes back
    assert snapshot.bad_records == {}
    apply_record(snapshot, key("group", "g"), good_group())  # created again
    assert snapshot.groups["g"] == GroupRecord(name="g", topics=["t"])
    assert snapshot.epochs == {"g": {TP("t", 0): 7}}
