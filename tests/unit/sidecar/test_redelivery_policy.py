"""The group's redelivery settings reach the sidecar: from SessionAccepted at join and from
every ConfigUpdate after it (live), older updates ignored; unset values fall back to the
sidecar's own defaults, -1 means "never give a record up"."""

from __future__ import annotations

import asyncio

from google.protobuf import duration_pb2

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.acks import NO_LIMIT
from services.consumer_sidecar.events import SessionEvents
from services.consumer_sidecar.partitions import Redelivery
from tests.support.classic_sessions import session

DEFAULTS = Redelivery(visibility=30.0, max_deliveries=10)


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def test_a_group_policy_falls_back_to_the_sidecars_defaults() -> None:
    assert Redelivery.of_group(None, 0, DEFAULTS) == DEFAULTS
    assert Redelivery.of_group(5.0, 0, DEFAULTS) == Redelivery(5.0, 10)
    assert Redelivery.of_group(None, 3, DEFAULTS) == Redelivery(30.0, 3)
    assert Redelivery.of_group(None, -1, DEFAULTS) == Redelivery(30.0, NO_LIMIT)


def test_the_session_applies_the_groups_policy_at_join_and_on_every_update() -> None:
    async def scenario() -> None:
        seen: list[tuple[float | None, int, str]] = []
        client, _ = session(
            SessionEvents(
                on_delivery_policy=lambda visibility, limit, dlq: seen.append(
                    (visibility, limit, dlq)
                )
            )
        )
        joined = assigner_pb2.SessionAccepted(session_id="x", config_version=3)
        await client._handle(assigner_pb2.SessionResponse(accepted=joined))
        update = assigner_pb2.ConfigUpdate(
            config_version=4,
            visibility_timeout=seconds(7),
            max_deliveries=-1,
            dead_letter_topic="orders.dlq",
        )
        await client._handle(assigner_pb2.SessionResponse(config_update=update))
        older = assigner_pb2.ConfigUpdate(config_version=2, max_deliveries=5)
        await client._handle(assigner_pb2.SessionResponse(config_update=older))
        assert seen == [(None, 0, ""), (7.0, -1, "orders.dlq")]

    asyncio.run(scenario())
