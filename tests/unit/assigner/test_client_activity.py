"""Per-client views (ListClients, /ui/clients): the rates from the sidecars' reported
totals (pure, with Hypothesis properties), the rows joined with the bindings, and the RPC
on the real servicers fed by Session heartbeats."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataservice.assigner.v1 import admin_pb2, assigner_pb2, binding_pb2
from services.assigner.client_activity import (
    ClientActivity,
    Totals,
    client_rows,
    increase,
    rate,
)
from tests.unit.assigner.rpc_harness import Assigner, Sidecar, reason_of, refused, run

# ---- rates (pure) ---------------------------------------------------------------------------


def test_rate_is_the_rise_over_the_span() -> None:
    assert rate([(0.0, 10), (1.0, 30), (2.0, 50)]) == 20.0
    assert rate([(5.0, 7)]) == 0.0  # one sample: no rate yet
    assert rate([]) == 0.0
    assert rate([(1.0, 3), (1.0, 9)]) == 0.0  # no span


def test_a_lower_total_is_a_restart_counted_from_zero() -> None:
    # 100 → 120 (+20), restart, 15 (+15), 40 (+25)
    assert increase([(0.0, 100), (1.0, 120), (2.0, 15), (3.0, 40)]) == 60.0


@given(
    per_second=st.integers(min_value=0, max_value=10_000),
    gaps=st.lists(st.floats(min_value=0.05, max_value=5.0), min_size=1, max_size=30),
)
def test_a_steady_counter_has_its_own_rate(per_second: int, gaps: list[float]) -> None:
    at, samples = 0.0, [(0.0, 0)]
    for gap in gaps:
        at += gap
        samples.append((at, round(per_second * at)))
    # Rounding to whole records moves each end by at most half a record.
    assert rate(samples) == pytest.approx(per_second, abs=1.0 / at + 1e-9)


@given(st.lists(st.integers(min_value=0, max_value=10**9), max_size=30))
def test_the_increase_is_never_negative(values: list[int]) -> None:
    assert increase((float(i), v) for i, v in enumerate(values)) >= 0


def test_the_window_keeps_the_samples_of_its_span_only() -> None:
    activity = ClientActivity(window=10.0)
    for second in range(65):  # 100 records/s for 50 s, then 10 records/s
        records = 100 * min(second, 50) + 10 * max(0, second - 50)
        activity.observe("sc-0", {"app": Totals(records=records)}, float(second))
    totals, rates = activity.by_client()["app"]["sc-0"]
    assert totals.records == 5140
    assert rates.records == pytest.approx(10.0)  # over the last 10 s (54 → 64) only


def test_a_client_a_sidecar_no_longer_reports_and_a_departed_sidecar_are_dropped() -> None:
    activity = ClientActivity()
    activity.observe("sc-0", {"a": Totals(), "b": Totals()}, 0.0)
    activity.observe("sc-1", {"a": Totals()}, 0.0)
    activity.observe("sc-0", {"a": Totals()}, 1.0)
    assert {c: sorted(s) for c, s in activity.by_client().items()} == {"a": ["sc-0", "sc-1"]}
    activity.retain(["sc-1"])
    assert {c: sorted(s) for c, s in activity.by_client().items()} == {"a": ["sc-1"]}


# ---- rows -------------------------------------------------------------------------------------


def test_rows_sum_the_sidecars_and_list_bound_and_unbound_clients() -> None:
    activity = ClientActivity()
    for at, n in ((0.0, 0), (2.0, 1)):
        activity.observe(
            "sc-0",
            {"app": Totals(records=100 * n, acks=90 * n, errors=1 * n, requests=10 * n,
                           last_seen=1000.0 + at, active_streams=1)},
            at,
        )  # fmt: skip
        activity.observe(
            "sc-1",
            {
                "app": Totals(records=300 * n, acks=300 * n, requests=10 * n, last_seen=990.0),
                "direct": Totals(records=40 * n, requests=4 * n, last_seen=995.0),
            },
            at,
        )
    rows = client_rows(
        "g",
        activity,
        {"app": 1500.0, "idle": 0.0},
        {"sc-0": "h0:7080", "sc-1": "h1:7080"},
    )
    by_id = {r.client_id: r for r in rows}
    assert [r.client_id for r in rows] == ["app", "direct", "idle"]
    app = by_id["app"]
    assert [(s.sidecar_id, s.endpoint) for s in app.sidecars] == [
        ("sc-0", "h0:7080"),
        ("sc-1", "h1:7080"),
    ]
    assert (app.rates.records, app.rates.acks, app.rates.errors) == (200.0, 195.0, 0.5)
    assert app.error_ratio == pytest.approx(0.05)  # 1 failed of 20 requests
    assert (app.last_seen, app.bound, app.bound_since) == (1002.0, True, 1500.0)
    assert by_id["direct"].bound is False and by_id["direct"].rates.records == 20.0
    idle = by_id["idle"]
    assert (idle.sidecars, idle.last_seen, idle.bound, idle.rates.records) == ((), 0.0, True, 0)


# ---- ListClients on the real servicers ------------------------------------------------------


async def report(sidecar: Sidecar, **clients: Totals) -> None:
    """A heartbeat carrying the sidecar's client totals (and no lease), answered."""
    sidecar.seq += 1
    await sidecar.call.write(
        assigner_pb2.SessionRequest(
            heartbeat=assigner_pb2.SessionHeartbeat(
                seq=sidecar.seq,
                clients=[
                    assigner_pb2.ClientActivity(
                        client_id=client_id,
                        records_served=t.records,
                        acks=t.acks,
                        errors=t.errors,
                        requests=t.requests,
                        last_seen_seconds=t.last_seen,
                        active_streams=t.active_streams,
                    )
                    for client_id, t in clients.items()
                ],
            )
        )
    )
    while (await sidecar.next()).WhichOneof("kind") != "heartbeat_ack":
        pass


def test_list_clients_shows_each_client_with_its_sidecars_rates_and_binding() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        await a.create("h")
        before = time.time()
        await a.bindings.Bind(binding_pb2.BindRequest(client_id="app", group="g"))
        await a.bindings.Bind(binding_pb2.BindRequest(client_id="idle", group="g"))
        sidecars = [Sidecar(a.sessions, "sc-0"), Sidecar(a.sessions, "sc-1")]
        for s in sidecars:
            await s.join("g")
        now = time.time()
        for s in sidecars:
            await report(s, app=Totals(records=0, requests=0, last_seen=now))
        await asyncio.sleep(0.5)
        await report(sidecars[0], app=Totals(records=500, acks=500, requests=5, last_seen=now))
        await report(
            sidecars[1], app=Totals(records=100, errors=1, requests=2, last_seen=now + 0.1)
        )

        one = await a.admin.ListClients(admin_pb2.ListClientsRequest(group="g"))
        every = await a.admin.ListClients(admin_pb2.ListClientsRequest())
        assert one == every  # h has no client
        assert [(c.group, c.client_id, c.bound) for c in one.clients] == [
            ("g", "app", True),
            ("g", "idle", True),
        ]
        app = one.clients[0]
        assert [s.sidecar_id for s in app.sidecars] == ["sc-0", "sc-1"]
        assert all(s.endpoint.endswith(":7080") for s in app.sidecars)
        # 500 and 100 records over at least the 0.5 s between the heartbeats
        assert 0 < app.sidecars[1].records_per_second < app.sidecars[0].records_per_second
        assert app.sidecars[0].records_per_second <= 1000.0
        assert app.records_per_second == pytest.approx(
            sum(s.records_per_second for s in app.sidecars)
        )
        # 1 failed of 7 requests (the two sidecars' spans differ by a few milliseconds)
        assert app.errors_per_second > 0 and app.error_ratio == pytest.approx(1 / 7, rel=0.05)
        assert app.last_seen_seconds == pytest.approx(now + 0.1)
        assert before <= app.bound_since_seconds <= time.time()
        idle = one.clients[1]
        assert (len(idle.sidecars), idle.last_seen_seconds) == (0, 0.0)

        await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app", group="g"))
        unbound = await a.admin.ListClients(admin_pb2.ListClientsRequest(group="g"))
        assert [(c.client_id, c.bound, c.bound_since_seconds > 0) for c in unbound.clients] == [
            ("app", False, False),  # still reading: seen at the sidecars without a binding
            ("idle", True, True),
        ]
        for s in sidecars:
            await s.close()

    run(body)


def test_list_clients_of_an_unknown_or_malformed_group_is_refused() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.ListClients(admin_pb2.ListClientsRequest(group="nope")))
        assert reason_of(err)[:2] == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND")
        err = await refused(a.admin.ListClients(admin_pb2.ListClientsRequest(group="a b/c")))
        assert reason_of(err)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")

    run(body)


def test_list_clients_waits_for_the_assigner_to_serve() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.ListClients(admin_pb2.ListClientsRequest()))
        assert reason_of(err)[:2] == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


def test_a_report_no_sidecar_sends_is_read_as_zeros() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-0")
        await sidecar.join("g")
        await report(
            sidecar,
            odd=Totals(records=-5, acks=-1, errors=-3, requests=-2, last_seen=float("nan")),
            far=Totals(last_seen=float("inf"), active_streams=-1),
        )
        listed = await a.admin.ListClients(admin_pb2.ListClientsRequest(group="g"))
        for c in listed.clients:
            (at,) = c.sidecars
            assert (c.last_seen_seconds, at.active_streams, c.records_per_second) == (0, 0, 0)
        await sidecar.close()

    run(body)
