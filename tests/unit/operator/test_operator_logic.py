"""The operator's pure rules: the Lease election step (client-go's: take over only after a
whole duration without a change seen, never while another holder renews) and the status a
DsGroup gets (Ready, Drifted, observedGeneration; a condition keeps its transition time
while its status holds)."""

from __future__ import annotations

from typing import Any

import pytest

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.operator.election import decide
from services.operator.status import Condition, live_status, same_status


@pytest.mark.parametrize(
    ("holder", "unchanged_for", "exists", "step"),
    [
        (None, None, False, "create"),
        ("me", 0.0, True, "renew"),
        ("me", 100.0, True, "renew"),
        ("other", 0.0, True, "follow"),
        ("other", 14.9, True, "follow"),
        ("other", 15.0, True, "take"),  # unchanged for a whole duration: expired
        ("other", None, True, "follow"),  # just changed: the holder renewed
        (None, 0.0, True, "take"),  # released
        ("", 0.0, True, "take"),
    ],
)
def test_the_lease_step(holder: str | None, unchanged_for: float | None, exists: bool,
                        step: str) -> None:  # fmt: skip
    assert decide(holder, "me", unchanged_for, 15.0, exists) == step


def resource(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "dataservice.io/v1alpha1",
        "kind": "DsGroup",
        "metadata": {"name": "orders", "namespace": "shop", "generation": generation},
        "spec": {"topics": ["orders"], "consumerConfig": {"fetch.max.bytes": "1048576"}},
        "status": status or {},
    }


def described(fetch: str = "1048576") -> admin_pb2.DescribeGroupResponse:
    config = types_pb2.GroupConfig(
        name="orders",
        topics=["orders"],
        mode=common_pb2.GROUP_MODE_LEASED,
        consumer_config={"fetch.max.bytes": fetch},
        config_version=3,
    )
    return admin_pb2.DescribeGroupResponse(
        config=config,
        leases=[types_pb2.Lease(topic="orders", partition=p, holder="sc-1") for p in range(2)],
        partitions=[admin_pb2.PartitionLag(topic="orders", partition=p, lag_records=5)
                    for p in range(2)],
    )  # fmt: skip


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_an_applied_group_is_ready_and_in_sync_with_its_numbers() -> None:
    status = live_status(resource(), described(), 1, None, "T1")
    assert status["observedGeneration"] == 1 and status["groupName"] == "orders"
    assert (status["partitions"], status["partitionsHeld"], status["lagRecords"]) == (2, 2, 10)
    assert status["configVersion"] == 3
    assert conditions(status) == {"Ready": ("True", "Applied"), "Drifted": ("False", "InSync")}
    # Written again with nothing changed: the same status, transition times kept.
    again = live_status(resource(status=status), described(), 1, None, "T2")
    assert same_status(status, again)
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {"T1"}


def test_a_change_made_outside_kubernetes_is_drift_named_by_field() -> None:
    first = live_status(resource(), described(), 1, None, "T1")
    drifted = live_status(resource(status=first), described("4194304"), 1, None, "T2")
    drift = next(c for c in drifted["conditions"] if c["type"] == "Drifted")
    assert (drift["status"], drift["reason"]) == ("True", "ChangedOutsideKubernetes")
    assert "consumerConfig" in drift["message"] and drift["lastTransitionTime"] == "T2"
    assert not same_status(first, drifted)


def test_a_missing_group_and_a_failed_apply_are_not_ready() -> None:
    missing = live_status(resource(), None, 1, None, "T1")
    assert conditions(missing) == {"Ready": ("False", "GroupMissing")}
    failed = live_status(
        resource(2), None, 1, Condition("Ready", False, "ApplyFailed", "TOPIC_NOT_FOUND"), "T1"
    )
    assert failed["observedGeneration"] == 1  # generation 2 not applied
    assert conditions(failed) == {"Ready": ("False", "ApplyFailed")}
