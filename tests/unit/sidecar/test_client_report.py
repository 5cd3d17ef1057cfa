"""What a sidecar reports of its application clients in every Session heartbeat (for
AdminService.ListClients): each client's totals from the client-access metrics, errors
being the requests that ended neither OK nor CANCELLED."""

from __future__ import annotations

import asyncio

from services.consumer_sidecar.client_access import ClientIdLimiter, ClientMetrics
from tests.support.session_grants import Harness


def test_activity_counts_records_acks_requests_and_errors_per_client() -> None:
    clock = [1000.0]
    clients = ClientMetrics("g", ClientIdLimiter(10, 60), wall=lambda: clock[0])
    clients.request("app", "Fetch", "OK", 0.01)
    clients.request("app", "Fetch", "UNAVAILABLE", 0.01)
    clients.request("app", "Stream", "CANCELLED", 5.0)  # the client closed its stream
    clients.request("app", "Ack", "FAILED_PRECONDITION", 0.01)
    clients.served_records("app", 40, 4000)
    clients.acked("app", 30)
    clock[0] = 1002.5
    clients.stream_opened("other-app")
    (app, other) = sorted(clients.activity(), key=lambda c: c.client_id)
    assert (app.client_id, app.records, app.acks, app.requests, app.errors) == (
        "app", 40, 30, 4, 2,
    )  # fmt: skip
    assert (app.last_seen, app.active_streams) == (1000.0, 0)
    assert (other.client_id, other.last_seen, other.active_streams) == ("other-app", 1002.5, 1)


def test_every_heartbeat_carries_the_clients_totals() -> None:
    async def body() -> None:
        h = Harness()
        clients = ClientMetrics("g", ClientIdLimiter(10, 60), wall=lambda: 1234.5)
        h.session.client_activity = clients.activity
        await h.send_heartbeat()
        first = h.session._heartbeat()  # nothing served yet
        assert list(first.heartbeat.clients) == []
        clients.served_records("app", 7, 70)
        clients.acked("app", 5)
        clients.request("app", "Fetch", "INTERNAL", 0.1)
        (reported,) = h.session._heartbeat().heartbeat.clients
        assert (reported.client_id, reported.records_served, reported.acks) == ("app", 7, 5)
        assert (reported.errors, reported.requests, reported.last_seen_seconds) == (1, 1, 1234.5)
        await h.requests.aclose()

    asyncio.run(body())
