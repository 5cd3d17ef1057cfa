"""The fault catalogue is complete and the site's fault reference carries its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataservice.common.v1 import common_pb2
from services.runtime import faults

FAULTS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "faults.md"


def test_every_fault_type_is_catalogued() -> None:
    types = {v for v in common_pb2.FaultType.values() if v != common_pb2.FAULT_TYPE_UNSPECIFIED}
    assert set(faults.CATALOGUE) == types
    for spec in faults.CATALOGUE.values():
        assert spec.what and spec.when and spec.resolved
        assert spec.who in {"assigner", "sidecar", "notifier"}
        assert spec.severity != common_pb2.SEVERITY_UNSPECIFIED


def test_fault_reference_page_has_the_catalogue_table() -> None:
    """docs/reference/faults.md is generated (scripts/gen_docs.py); stale, this fails."""
    assert faults.markdown_table() in FAULTS_PAGE.read_text()


def test_names_parse_both_ways() -> None:
    assert faults.parse_type("lag_error") == common_pb2.FAULT_TYPE_LAG_ERROR
    assert faults.parse_type("FAULT_TYPE_CONSUMER_LOST") == common_pb2.FAULT_TYPE_CONSUMER_LOST
    assert faults.parse_severity("warning") == common_pb2.SEVERITY_WARNING
    with pytest.raises(ValueError, match="unknown"):
        faults.parse_type("NOPE")
    with pytest.raises(ValueError, match="UNSPECIFIED"):
        faults.parse_type("UNSPECIFIED")


def test_default_dedupe_key_ignores_state_and_partition_order() -> None:
    a = common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_POISON_RECORD, group="g", topic="t", partitions=[3, 1]
    )
    b = common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_POISON_RECORD,
        state=common_pb2.FAULT_STATE_RESOLVED,
        group="g",
        topic="t",
        partitions=[1, 3],
    )
    assert faults.default_dedupe_key(a) == faults.default_dedupe_key(b) == "POISON_RECORD|g|t|1,3||"


def test_dedupe_keys_are_the_short_type_and_the_chosen_coordinates() -> None:
    assert faults.dedupe_key(common_pb2.FAULT_TYPE_ASSIGNER_FAILOVER) == "ASSIGNER_FAILOVER"
    assert (
        faults.dedupe_key(common_pb2.FAULT_TYPE_CONSUMER_LOST, "g", "sidecar-1")
        == "CONSUMER_LOST|g|sidecar-1"
    )
