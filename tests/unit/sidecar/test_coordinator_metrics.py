"""The coordinator metrics' timing without Kafka (issue 21): the round timer, what the
session (leased mode), the lease keeper (an expiry) and Kafka's rebalance callbacks
(kafka_group mode) report, and how SidecarMetrics renders it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.events import LeaseEvents, SessionEvents
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.round_timing import RoundTimer, lost_latency
from services.runtime.topic_partition import TP
from tests.support.classic_sessions import (
    Clock,
    FakeConsumer,
    FakeFetcher,
    deliver,
    kafka_tps,
    membership,
)
from tests.support.session_grants import TOPIC, Harness, ack, grant, run

T, U = TP("t", 0), TP("t", 1)


class Events:
    """What the rebalance callbacks report (classic.RebalanceEvents), recorded."""

    def __init__(self) -> None:
        self.joins: list[tuple[bool, float | None]] = []
        self.syncs: list[float] = []
        self.changes: list[str] = []
        self.settled: list[tuple[str, float]] = []
        self.lost: list[float] = []

    def joined(self, ok: bool, seconds: float | None) -> None:
        self.joins.append((ok, seconds))

    def synced(self, seconds: float) -> None:
        self.syncs.append(seconds)

    def lease_changed(self, kind: str) -> None:
        self.changes.append(kind)

    def lease_settled(self, kind: str, seconds: float) -> None:
        self.settled.append((kind, seconds))

    def partitions_lost(self, seconds: float) -> None:
        self.lost.append(seconds)


# ---- the round timer --------------------------------------------------------------------


def test_a_round_times_its_join_and_its_first_assignment_once() -> None:
    clock = Clock()
    rounds = RoundTimer(clock)
    rounds.start()
    clock.now += 0.25
    assert rounds.joined() == 0.25
    clock.now += 1.5
    assert rounds.assigned() == 1.5
    assert rounds.assigned() is None, "only the first assignment of the round is its sync"


def test_a_join_whose_start_was_not_seen_has_no_latency() -> None:
    rounds = RoundTimer(Clock())
    assert rounds.joined() is None
    assert rounds.assigned() == 0.0  # joined now, assigned now


def test_a_revoke_does_not_move_the_start_of_a_round_under_way() -> None:
    clock = Clock()
    rounds = RoundTimer(clock)
    rounds.start()
    clock.now += 1.0
    rounds.start_unless_pending()
    clock.now += 1.0
    assert rounds.joined() == 2.0


def test_a_round_that_ends_before_joining_is_a_failed_join() -> None:
    rounds = RoundTimer(Clock())
    rounds.start()
    assert rounds.failed()
    assert not rounds.failed(), "forgotten once reported"
    rounds.start()
    rounds.joined()
    assert not rounds.failed(), "joined: not a failed join"
    assert rounds.assigned() is None, "the session ended: no sync for it"


@given(st.lists(st.sampled_from(["start", "maybe", "join", "assign", "fail", "tick"])))
def test_latencies_are_never_negative_and_a_join_has_one_only_after_a_start(
    steps: list[str],
) -> None:
    clock = Clock()
    rounds = RoundTimer(clock)
    started = False
    for step in steps:
        if step == "tick":
            clock.now += 0.1
        elif step == "start":
            rounds.start()
            started = True
        elif step == "maybe":
            rounds.start_unless_pending()
            started = True
        elif step == "join":
            seconds = rounds.joined()
            assert (seconds is not None) == started
            assert seconds is None or seconds >= 0
            started = False
        elif step == "assign":
            seconds = rounds.assigned()
            assert seconds is None or seconds >= 0
        else:
            assert rounds.failed() == started
            started = False
        assert rounds.pending == started


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_a_lost_latency_is_the_time_past_the_deadline(deadline: float, now: float) -> None:
    assert lost_latency(deadline, now) == max(0.0, now - deadline)


# ---- kafka_group mode: the rebalance callbacks -------------------------------------------


def test_rebalance_callbacks_report_join_sync_and_partition_changes() -> None:
    fetcher = FakeFetcher()
    m, clock = membership(fetcher)
    events = Events()
    m.events = events
    consumer: Any = FakeConsumer()

    m.subscribing()
    clock.now += 3.0  # JoinGroup + SyncGroup inside librdkafka
    m.on_assign(consumer, kafka_tps(T, U))
    assert events.joins == [(True, 3.0)]
    assert len(events.syncs) == 1 and events.syncs[0] >= 0
    assert events.changes == ["grant", "grant"]
    assert [kind for kind, _ in events.settled] == ["grant", "grant"]

    # A second member joins: cooperative-sticky revokes U, then a round assigns nothing.
    m.on_revoke(consumer, kafka_tps(U))
    clock.now += 2.0
    m.on_assign(consumer, [])
    assert events.joins[-1] == (True, 2.0), "revoke until the next assign"
    assert events.changes[-1] == "revoke"
    assert len(events.syncs) == 2

    # A rebalance another member began, that only grows this one: counted, not timed.
    m.on_assign(consumer, kafka_tps(U))
    assert events.joins[-1] == (True, None)


def test_the_drain_of_a_revoke_is_its_settle_time() -> None:
    fetcher = FakeFetcher()
    m, _clock = membership(fetcher, drain=5.0)
    events = Events()
    m.events = events
    consumer: Any = FakeConsumer()
    m.on_assign(consumer, kafka_tps(T))
    deliver(m, T, [0, 1])  # in flight, never acked: the revoke waits the drain timeout
    m.on_revoke(consumer, kafka_tps(T))
    kind, seconds = events.settled[-1]
    assert kind == "revoke" and seconds >= 5.0


def test_lost_partitions_are_a_failed_rebalance_with_their_handling_time() -> None:
    fetcher = FakeFetcher()
    m, clock = membership(fetcher)
    events = Events()
    m.events = events
    consumer: Any = FakeConsumer()
    m.on_assign(consumer, kafka_tps(T, U))
    m.on_lost(consumer, kafka_tps(T, U))
    assert events.joins[-1] == (False, None)
    assert events.changes[-2:] == ["expire", "expire"]
    assert len(events.lost) == 2 and all(s >= 0 for s in events.lost)
    clock.now += 4.0
    m.on_assign(consumer, kafka_tps(T))  # librdkafka joined again
    assert events.joins[-1] == (True, 4.0)


def test_start_offsets_that_cannot_be_read_make_a_failed_join() -> None:
    m, _clock = membership(FakeFetcher(fail="assign"))
    events = Events()
    m.events = events
    m.on_assign(FakeConsumer(), kafka_tps(T))  # type: ignore[arg-type]
    assert events.joins == [(False, None)]
    assert events.changes == ["grant"]


# ---- leased mode: the session and the lease keeper ---------------------------------------


def accepted() -> assigner_pb2.SessionResponse:
    return assigner_pb2.SessionResponse(accepted=assigner_pb2.SessionAccepted(session_id="s"))


def test_the_session_reports_its_join_and_its_first_grant() -> None:
    joins: list[tuple[bool, float | None]] = []
    syncs: list[float] = []

    async def body(h: Harness) -> None:
        h.session._round.start()  # the Join sent (_one_session)
        await asyncio.sleep(0.02)
        await h.session._handle(accepted())
        assert len(joins) == 1 and joins[0][0] and (joins[0][1] or 0) >= 0.02
        await asyncio.sleep(0.02)
        await h.session._handle(grant(0, 1))
        await h.session._handle(grant(1, 1))
        await asyncio.sleep(0.05)
        assert len(syncs) == 1 and syncs[0] >= 0.02, "the first grant only"
        # A session that breaks before it joins: a failed join.
        h.session._round.start()
        h.session._session_ended(failed=True)
        assert joins[-1] == (False, None)
        # One that only moved to a new leader is not.
        h.session._round.start()
        h.session._session_ended(failed=False)
        assert len(joins) == 2

    run(
        body,
        session_events=SessionEvents(
            on_join=lambda ok, seconds: joins.append((ok, seconds)), on_sync=syncs.append
        ),
    )


def test_a_lease_expiry_reports_its_latency_past_the_deadline() -> None:
    lost: list[float] = []

    async def body(h: Harness) -> None:
        await h.session._handle(grant(0, 1))
        await asyncio.sleep(0.05)
        seq, _sent = await h.send_heartbeat()
        await h.session._handle(ack(seq, (0, 1)))
        part = h.table.get(TP(TOPIC, 0))
        assert part is not None
        part.deadline = time.monotonic() - 0.3  # renewals stopped 0.3 s ago
        await h.keeper.suspend_expired()
        assert part.suspended_at is not None
        assert len(lost) == 1 and lost[0] >= 0.3

    run(body, lease_events=LeaseEvents(on_partition_lost=lost.append))


# ---- the metrics ---------------------------------------------------------------------------


def test_sidecar_metrics_render_the_coordinator_figures() -> None:
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry, "g")
    before = time.time()
    metrics.joined(True, 0.5)
    metrics.joined(True, None)
    metrics.joined(False, None)
    metrics.synced(0.2)
    metrics.partitions_lost(1.5)
    metrics.heartbeat_acked(0.01)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"group": "g", **labels})

    assert value("ds_sidecar_joins_total", result="ok") == 2
    assert value("ds_sidecar_joins_total", result="error") == 1
    assert value("ds_sidecar_join_seconds_count") == 1
    assert value("ds_sidecar_join_seconds_sum") == 0.5
    assert value("ds_sidecar_sync_seconds_count") == 1
    assert value("ds_sidecar_partitions_lost_seconds_sum") == 1.5
    assert (value("ds_sidecar_last_heartbeat_timestamp_seconds") or 0) >= before
