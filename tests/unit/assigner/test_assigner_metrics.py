"""Assigner metrics: imbalance ratio, distribution series, and the GroupRuntime hooks
(grants, revokes, expiries, handoff latency, bindings, rebinds) on a fake group."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dataservice.assigner.v1 import assigner_pb2
from services.assigner.groups import GroupRuntime
from services.assigner.metrics import AssignerMetrics, imbalance_ratio
from services.assigner.settings import AssignerSettings
from services.assigner.state import GroupRecord
from services.runtime.topic_partition import TopicPartition


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_imbalance_ratio() -> None:
    assert imbalance_ratio({}) == 0.0
    assert imbalance_ratio({"a": 0, "b": 0}) == 0.0
    assert imbalance_ratio({"a": 2, "b": 2}) == 1.0
    assert imbalance_ratio({"a": 3, "b": 1}) == 1.5
    assert imbalance_ratio({"a": 4, "b": 0}) == 2.0


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 1000), min_size=1))
def test_imbalance_ratio_bounds(counts: dict[str, int]) -> None:
    ratio = imbalance_ratio(counts)
    if sum(counts.values()) == 0:
        assert ratio == 0.0
    else:
        assert 1.0 - 1e-9 <= ratio <= len(counts) + 1e-9


def test_distribution_series_follow_the_sidecars() -> None:
    registry = CollectorRegistry()
    metrics = AssignerMetrics(registry)
    metrics.set_distribution("g", {"a": 3, "b": 1})
    metrics.set_sidecar_rate("g", "b", 100.0)
    assert value(registry, "ds_assigner_partitions", group="g", sidecar="a") == 3
    assert value(registry, "ds_assigner_imbalance_ratio", group="g") == 1.5
    assert value(registry, "ds_assigner_members", group="g") == 2
    metrics.set_distribution("g", {"a": 4})
    assert (
        registry.get_sample_value("ds_assigner_partitions", {"group": "g", "sidecar": "b"}) is None
    )
    assert (
        registry.get_sample_value(
            "ds_assigner_sidecar_bytes_per_second", {"group": "g", "sidecar": "b"}
        )
        is None
    )
    # A sidecar back after its series was dropped is exported again (not a stale child).
    metrics.set_sidecar_rate("g", "b", 7.0)
    assert value(registry, "ds_assigner_sidecar_bytes_per_second", group="g", sidecar="b") == 7
    metrics.forget_group("g")
    assert registry.get_sample_value("ds_assigner_members", {"group": "g"}) is None
    assert (
        registry.get_sample_value(
            "ds_assigner_sidecar_bytes_per_second", {"group": "g", "sidecar": "b"}
        )
        is None
    )
    metrics.set_sidecar_rate("g", "b", 9.0)
    assert value(registry, "ds_assigner_sidecar_bytes_per_second", group="g", sidecar="b") == 9
    # The counts follow after the group was forgotten and set again (no stale gauge kept).
    metrics.set_distribution("g", {"a": 4, "b": 2})
    metrics.set_distribution("g", {"a": 4, "b": 3})
    assert value(registry, "ds_assigner_partitions", group="g", sidecar="a") == 4
    assert value(registry, "ds_assigner_partitions", group="g", sidecar="b") == 3
    assert value(registry, "ds_assigner_leader") == 0


def join(sidecar: str) -> assigner_pb2.SessionJoin:
    return assigner_pb2.SessionJoin(sidecar_id=sidecar, group="g", endpoint=f"{sidecar}:1")


def heartbeat(
    seq: int, leases: list[tuple[TopicPartition, int]], rate: float = 0.0,
    released: list[tuple[TopicPartition, int]] = (),  # type: ignore[assignment]
) -> assigner_pb2.SessionHeartbeat:  # fmt: skip
    return assigner_pb2.SessionHeartbeat(
        seq=seq,
        leases=[
            assigner_pb2.LeaseProgress(
                topic=tp.topic, partition=tp.partition, epoch=e, committed_offset=0,
                bytes_per_second=rate,
            )
            for tp, e in leases
        ],
        released_leases=[
            assigner_pb2.ReleasedLease(topic=tp.topic, partition=tp.partition, epoch=e,
                                       committed_offset=5)
            for tp, e in released
        ],
    )  # fmt: skip


def grants(conn: object) -> list[assigner_pb2.LeaseGrant]:
    out = []
    queue: asyncio.Queue[assigner_pb2.SessionResponse | None] = conn.queue  # type: ignore[attr-defined]
    while not queue.empty():
        message = queue.get_nowait()
        if message is not None and message.WhichOneof("kind") == "grant":
            out.append(message.grant)
    return out


def test_group_runtime_counts_lease_changes_handoffs_and_rebinds() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        metrics = AssignerMetrics(registry)
        settings = AssignerSettings(hold_window_seconds=0)
        tps = [TopicPartition("t", p) for p in range(4)]
        group = GroupRuntime(GroupRecord(name="g", topics=["t"]), tps, settings, metrics, None)
        group.bindings.bind("client-1")
        assert value(registry, "ds_assigner_bindings", group="g") == 1
        now = 100.0
        a = group.attach(join("a"), now)
        got_a = {(g.topic, g.partition): g.epoch for g in grants(a)}
        assert len(got_a) == 4
        assert value(registry, "ds_assigner_lease_grants_total", group="g") == 4
        group.heartbeat(
            a, heartbeat(1, [(TopicPartition(*k), e) for k, e in got_a.items()], 50.0), now
        )
        assert (
            value(registry, "ds_assigner_sidecar_bytes_per_second", group="g", sidecar="a") == 200
        )
        # b joins: two partitions are revoked from a, released, and granted to b.
        b = group.attach(join("b"), now)
        assert value(registry, "ds_assigner_lease_revokes_total", group="g") == 2
        queue = a.queue
        revoked = []
        while not queue.empty():
            m = queue.get_nowait()
            if m is not None and m.WhichOneof("kind") == "revoke":
                revoked.append((TopicPartition(m.revoke.topic, m.revoke.partition), m.revoke.epoch))
        assert len(revoked) == 2
        group.heartbeat(a, heartbeat(2, [], released=revoked), now + 0.5)
        await asyncio.sleep(0)
        got_b = [(TopicPartition(g.topic, g.partition), g.epoch) for g in grants(b)]
        assert len(got_b) == 2
        assert value(registry, "ds_assigner_handoff_latency_seconds_count", group="g") == 0
        group.heartbeat(b, heartbeat(1, got_b), now + 1.0)
        assert value(registry, "ds_assigner_handoff_latency_seconds_count", group="g") == 2
        assert value(registry, "ds_assigner_imbalance_ratio", group="g") == 1.0
        assert value(registry, "ds_assigner_rebinds_total", group="g") == 1  # a -> a, b
        # b goes silent while a keeps heartbeating: b's two leases lapse at their expiry.
        later = now + 1.0 + settings.lease_ttl_seconds + settings.lease_grace_seconds + 1
        kept = [
            (TopicPartition(*k), e)
            for k, e in got_a.items()
            if (TopicPartition(*k), e) not in revoked
        ]
        group.heartbeat(a, heartbeat(3, kept), later)
        group.tick(later)
        assert value(registry, "ds_assigner_lease_expiries_total", group="g") == 2
        group.bindings.unbind("client-1")
        assert value(registry, "ds_assigner_bindings", group="g") == 0
        group.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("leading", [True, False])
def test_leader_gauge(leading: bool) -> None:
    registry = CollectorRegistry()
    metrics = AssignerMetrics(registry)
    metrics.leader.set(1 if leading else 0)
    assert value(registry, "ds_assigner_leader") == (1 if leading else 0)
