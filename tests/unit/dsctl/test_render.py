"""The documents and tables dsctl's read commands print (pure render functions)."""

from __future__ import annotations

import json

from google.protobuf import timestamp_pb2

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.dsctl import render
from tests.support.render_text import text_of


def described(
    name: str,
    partitions: list[tuple[int, int, int, float]],
    holders: dict[int, str],
    members: list[str],
    topic: str = "t",
) -> admin_pb2.DescribeGroupResponse:
    """partitions: (partition, committed, end, lag_seconds); lag as the assigner computes it."""
    response = admin_pb2.DescribeGroupResponse(
        config=types_pb2.GroupConfig(
            name=name, topics=[topic], mode=common_pb2.GROUP_MODE_LEASED, config_version=3
        )
    )
    for sidecar in members:
        response.members.add(sidecar_id=sidecar, endpoint=f"{sidecar}:7080")
    for partition, committed, end, age in partitions:
        response.partitions.add(
            topic=topic,
            partition=partition,
            committed_offset=committed,
            end_offset=end,
            lag_records=end - max(committed, 0),
            lag_seconds=age,
        )
        holder = holders.get(partition, "")
        response.leases.add(
            topic=topic,
            partition=partition,
            holder=holder,
            epoch=7 if holder else 0,
            state=types_pb2.LEASE_STATE_ACTIVE if holder else types_pb2.LEASE_STATE_UNASSIGNED,
        )
    return response


def test_lag_doc_maps_unknowns_to_null_and_sums() -> None:
    doc = render.lag_doc([described("g", [(0, 10, 15, 2.5), (1, -1, 4, -1.0)], {}, [])])
    group = doc["groups"][0]
    assert group["partitions"] == [
        {"topic": "t", "partition": 0, "committed": 10, "end": 15, "lag_records": 5,
         "lag_seconds": 2.5},
        {"topic": "t", "partition": 1, "committed": None, "end": 4, "lag_records": 4,
         "lag_seconds": None},
    ]  # fmt: skip
    assert group["total_lag"] == 9
    # One partition's age is unknown: the group's worst age is unknown, not 2.5 s.
    assert group["max_lag_seconds"] is None
    json.dumps(doc)  # JSON-able as is


def test_lag_doc_caught_up_group() -> None:
    doc = render.lag_doc([described("g", [(0, 15, 15, 0.0)], {0: "a"}, ["a"])])
    assert doc["groups"][0]["total_lag"] == 0
    assert doc["groups"][0]["max_lag_seconds"] == 0.0


def test_lag_over_threshold() -> None:
    small = described("small", [(0, 9, 10, 1.0)], {}, [])
    big = described("big", [(0, 0, 500, 9.0)], {}, [])
    doc = render.lag_doc([small, big])
    assert render.lag_over(doc, 100) == ["big"]
    assert render.lag_over(doc, 500) == []
    assert render.lag_over(doc, 0) == ["small", "big"]


def test_lag_table_shows_every_partition_and_a_total() -> None:
    doc = render.lag_doc([described("g", [(0, 1_000, 2_500, 75.0), (1, -1, 4, -1.0)], {}, [])])
    text = text_of(render.lag_table(doc))
    assert "1,500" in text and "1m15s" in text  # lag and age of partition 0
    assert "1,504" in text  # the group's total
    assert "?" in text  # partition 1: no commit, unknown age


def test_groups_doc_and_table() -> None:
    summary = admin_pb2.GroupSummary(
        config=types_pb2.GroupConfig(
            name="demo", topics=["a", "b"], mode=common_pb2.GROUP_MODE_KAFKA_GROUP
        ),
        member_count=2,
        partition_count=6,
        total_lag=-1,
    )
    doc = render.groups_doc([summary])
    assert doc == {
        "groups": [
            {"name": "demo", "mode": "kafka_group", "topics": ["a", "b"], "members": 2,
             "partitions": 6, "total_lag": None}
        ]
    }  # fmt: skip
    text = text_of(render.groups_table(doc))
    assert "demo" in text and "kafka_group" in text and "a, b" in text


def test_describe_names_who_wrote_each_commit_and_the_external_setting() -> None:
    """Issue 23: per partition, the holder, a reset through the mesh, or an external
    writer; and the group's external_offset_changes."""
    response = described("g", [(0, 3, 5, 1.0), (1, 5, 5, 0.0), (2, -1, 4, -1.0)], {}, [])
    response.config.external_offset_changes = types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT
    response.partitions[0].committed_by = "sidecar-a (epoch 7)"
    response.partitions[1].committed_by = "external (no metadata)"
    doc = render.describe_doc(response)
    assert [p["committed_by"] for p in doc["partitions"]] == [
        "sidecar-a (epoch 7)",
        "external (no metadata)",
        None,
    ]
    assert doc["config"]["external_offset_changes"] == "revert"
    text = text_of(render.describe_view(doc))
    for expected in ("committed by", "sidecar-a (epoch 7)", "external (no metadata)", "revert"):
        assert expected in text, expected


def test_describe_doc_has_config_members_leases_partitions_bindings() -> None:
    response = described("g", [(0, 3, 5, 1.0), (1, 5, 5, 0.0)], {0: "a", 1: "b"}, ["a", "b"])
    response.config.lease_ttl.FromSeconds(3)
    response.config.consumer_config["fetch.max.bytes"] = "1048576"
    expires = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    response.leases[0].expires_at.CopyFrom(expires)
    binding = response.bindings.add(client_id="app-1", group="g", version=4)
    endpoint = binding.endpoints.add(sidecar_id="a", address="a:7080")
    endpoint.partitions.add(topic="t", partition=0)
    doc = render.describe_doc(response)
    assert doc["config"]["lease_ttl_seconds"] == 3.0
    assert doc["config"]["heartbeat_interval_seconds"] is None  # server default
    assert doc["config"]["consumer_config"] == {"fetch.max.bytes": "1048576"}
    assert [m["sidecar_id"] for m in doc["members"]] == ["a", "b"]
    assert doc["leases"][0] == {
        "topic": "t", "partition": 0, "holder": "a", "epoch": 7, "state": "active",
        "expires_at": "2023-11-14T22:13:20Z",
    }  # fmt: skip
    assert doc["leases"][1]["expires_at"] is None
    assert doc["bindings"] == [
        {"group": "g", "client_id": "app-1", "version": 4,
         "endpoints": [{"sidecar_id": "a", "address": "a:7080", "zone": "",
                        "partitions": [{"topic": "t", "partition": 0}]}]}
    ]  # fmt: skip
    text = text_of(render.describe_view(doc))
    for expected in ("fetch.max.bytes=1048576", "2023-11-14T22:13:20Z", "app-1", "t[0]", "active"):
        assert expected in text


def test_bindings_table_client_without_endpoints() -> None:
    response = described("g", [], {}, [])
    response.bindings.add(client_id="lonely", group="g", version=1)
    doc = render.bindings_doc([response])
    text = text_of(render.bindings_table(doc["bindings"]))
    assert "lonely" in text and "(none yet)" in text


def test_fault_doc_uses_short_names() -> None:
    event = common_pb2.FaultEvent(
        id="e1",
        type=common_pb2.FAULT_TYPE_CONSUMER_LOST,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_ERROR,
        source_service="assigner",
        group="g",
        topic="t",
        partitions=[0, 2],
        consumer_id="sidecar-a",
        message="lost",
        attributes={"b": "2", "a": "1"},
        suppressed_count=3,
    )
    event.detected_at.FromSeconds(1_700_000_000)
    doc = render.fault_doc(event)
    assert (doc["type"], doc["state"], doc["severity"]) == ("CONSUMER_LOST", "OPEN", "ERROR")
    assert doc["detected_at"] == "2023-11-14T22:13:20Z"
    assert list(doc["attributes"]) == ["a", "b"]
    text = text_of(render.faults_table([doc]))
    assert "t[0,2]" in text and "sidecar-a" in text and "+3 suppressed" in text


def test_imbalance_is_max_over_mean() -> None:
    assert render.imbalance([2, 2]) == 1.0
    assert render.imbalance([3, 1]) == 1.5
    assert render.imbalance([4, 0, 0, 0]) == 4.0
    assert render.imbalance([]) is None
    assert render.imbalance([0, 0]) is None


def test_consumed_since_skips_uncommitted_and_clamps_resets() -> None:
    before = {("g", "t", 0): 10, ("g", "t", 1): 50}
    after = {("g", "t", 0): 40, ("g", "t", 1): 20, ("g", "t", 2): 5}
    assert render.consumed_since(before, after) == {("g", "t", 0): 30, ("g", "t", 1): 0}


def test_a_partitions_first_commit_counts_from_where_consumption_started() -> None:
    # Nothing committed yet: the group's position is end - lag (here the log starts at 0);
    # the first commit (20) then counts 20 records instead of being skipped.
    before = described("g", [(0, -1, 100, 1.0), (1, 75, 100, 1.0)], {0: "a", 1: "a"}, ["a"])
    after = described("g", [(0, 20, 100, 1.0), (1, 95, 100, 1.0)], {0: "a", 1: "a"}, ["a"])
    assert render.committed_offsets([before]) == {("g", "t", 0): 0, ("g", "t", 1): 75}
    consumed = render.consumed_since(
        render.committed_offsets([before]), render.committed_offsets([after])
    )
    assert consumed == {("g", "t", 0): 20, ("g", "t", 1): 20}


def test_top_doc_credits_rates_to_current_holder() -> None:
    before = described("g", [(0, 0, 100, 1.0), (1, 0, 100, 1.0), (2, 0, 100, 1.0)],
                       {0: "a", 1: "a", 2: "b"}, ["a", "b", "c"])  # fmt: skip
    after = described("g", [(0, 20, 100, 1.0), (1, 10, 100, 1.0), (2, 30, 100, 1.0)],
                      {0: "a", 1: "a", 2: ""}, ["a", "b", "c"])  # fmt: skip
    consumed = render.consumed_since(
        render.committed_offsets([before]), render.committed_offsets([after])
    )
    doc = render.top_doc([after], consumed, elapsed=2.0)
    group = doc["groups"][0]
    rows = {s["sidecar_id"]: s for s in group["sidecars"]}
    assert list(rows) == ["a", "b", "c", render.UNASSIGNED]
    assert rows["a"]["partitions"] == 2 and rows["a"]["records_per_second"] == 15.0
    assert rows["b"]["partitions"] == 0 and rows["b"]["records_per_second"] == 0.0
    assert rows[render.UNASSIGNED]["records_per_second"] == 15.0
    assert group["unassigned"] == 1
    assert group["records_per_second"] == 30.0
    assert group["imbalance"] == 3.0  # max 2 / mean (2 / 3 members)
    assert group["balanced"] is False
    assert doc["interval_seconds"] == 2.0
    totals = {s["sidecar_id"]: s for s in doc["sidecars"]}
    assert totals["a"] == {"sidecar_id": "a", "groups": 1, "partitions": 2,
                           "records_per_second": 15.0}  # fmt: skip
    text = text_of(render.top_table(doc))
    assert "imbalance 3.00" in text and "15.0" in text and "█" in text


def test_top_doc_without_interval_has_no_rates() -> None:
    doc = render.top_doc([described("g", [(0, 0, 1, 0.0)], {0: "a"}, ["a"])], None, None)
    assert doc["groups"][0]["records_per_second"] is None
    assert doc["groups"][0]["balanced"] is True
    assert "-" in text_of(render.top_table(doc))


def test_human_seconds() -> None:
    assert render.human_seconds(None) == "?"
    assert render.human_seconds(0.0) == "0s"
    assert render.human_seconds(12.34) == "12.3s"
    assert render.human_seconds(245) == "4m05s"
    assert render.human_seconds(7380) == "2h03m"
    assert render.human_seconds(3 * 86400 + 4 * 3600) == "3d04h"
