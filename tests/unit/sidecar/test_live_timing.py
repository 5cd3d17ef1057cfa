"""A kafka-fenced group's lease TTL and heartbeat interval reach the sidecar from
SessionAccepted at join and from a ConfigUpdate that changes them live (issue 36 item 2):
the same method applies both, with the delivery margin and the stall limit derived from
them; an older update and an update without timing change nothing."""

from __future__ import annotations

import asyncio

from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.session import delivery_margin_for
from services.consumer_sidecar.stall_watch import stall_limit_for
from tests.support.classic_sessions import session


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def test_a_config_update_changes_the_timing_live_like_a_join() -> None:
    async def scenario() -> None:
        client, _ = session()
        table = client.keeper.table

        def timing() -> tuple[float, float, float, float]:
            return (client.ttl, client.heartbeat_interval, table.delivery_margin, table.stall.limit)

        def derived(ttl: float, heartbeat: float) -> tuple[float, float, float, float]:
            margin = delivery_margin_for(client.delivery_margin, ttl, client.margin, heartbeat)
            return (ttl, heartbeat, margin, stall_limit_for(ttl, heartbeat))

        joined = assigner_pb2.SessionAccepted(
            session_id="x", config_version=3, lease_ttl=seconds(6), heartbeat_interval=seconds(2)
        )
        await client._handle(assigner_pb2.SessionResponse(accepted=joined))
        assert timing() == derived(6.0, 2.0)
        update = assigner_pb2.ConfigUpdate(
            config_version=4, lease_ttl=seconds(1.5), heartbeat_interval=seconds(0.5)
        )
        await client._handle(assigner_pb2.SessionResponse(config_update=update))
        assert timing() == derived(1.5, 0.5)
        older = assigner_pb2.ConfigUpdate(
            config_version=3, lease_ttl=seconds(6), heartbeat_interval=seconds(2)
        )
        await client._handle(assigner_pb2.SessionResponse(config_update=older))
        assert timing() == derived(1.5, 0.5)
        unset = assigner_pb2.ConfigUpdate(config_version=5, max_deliveries=3)
        await client._handle(assigner_pb2.SessionResponse(config_update=unset))
        assert timing() == derived(1.5, 0.5)

    asyncio.run(scenario())
