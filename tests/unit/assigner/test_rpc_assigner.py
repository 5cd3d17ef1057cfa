"""AssignerService (Session, Leave) on an in-process server: request validation, error
mapping (status code + ErrorInfo reason) and the happy path, without a Kafka broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from dataservice.assigner.v1 import assigner_pb2
from dsclient.reasons import retry_after
from services.assigner.settings import AssignerSettings
from tests.unit.assigner.rpc_harness import (
    TOPIC,
    Assigner,
    Sidecar,
    field_error,
    join,
    reason_of,
    run,
    stream_refused,
)


async def session_error(
    a: Assigner, *requests: assigner_pb2.SessionRequest
) -> grpc.aio.AioRpcError:
    async def messages() -> AsyncIterator[assigner_pb2.SessionRequest]:
        for request in requests:
            yield request
        await asyncio.sleep(5)  # keep the stream open: the error must come from the server

    return await stream_refused(a.sessions.Session(messages()))


# ---- Session ------------------------------------------------------------------------------


def test_a_session_is_accepted_granted_and_renewed() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert accepted.session_id
        assert list(accepted.topics) == [TOPIC]
        assert accepted.lease_ttl.ToNanoseconds() == int(a.settings.lease_ttl_seconds * 1e9)
        assert accepted.config_version == 1
        grants = await sidecar.grants(4)
        assert sorted(g.partition for g in grants) == [0, 1, 2, 3]
        assert all(g.topic == TOPIC and g.epoch == 1 for g in grants)
        # Each grant's epoch was durable before the grant was sent.
        assert any(w[0] == "epochs" and w[1] == "g" for w in a.store.writes)
        ack = await sidecar.heartbeat(grants)
        assert ack.seq == 1
        assert sorted(r.partition for r in ack.renewed_leases) == [0, 1, 2, 3]
        assert a.prometheus.get_sample_value("ds_assigner_sessions") == 1
        assert [m.id for m in a.groups.group("g").coordinator.live_members()] == ["sc-1"]
        await sidecar.close()

    run(body)


def test_the_first_session_message_must_be_a_join() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        err = await session_error(
            a, assigner_pb2.SessionRequest(heartbeat=assigner_pb2.SessionHeartbeat(seq=1))
        )
        code, reason, _ = reason_of(err)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "SESSION_NOT_JOINED")

    run(body)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (join("", "g"), "join.sidecar_id"),
        (join("has space", "g"), "join.sidecar_id"),
        (join("x" * 256, "g"), "join.sidecar_id"),
        (join("sc-1", "g", endpoint=""), "join.endpoint"),
        (join("sc-1", "g", capacity=-1), "join.capacity"),
        (join("sc-1", ""), "group"),
    ],
)
def test_a_bad_join_is_invalid_field(request_: assigner_pb2.SessionRequest, field: str) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        assert field_error(await session_error(a, request_)) == field

    run(body)


def test_joining_an_unknown_group_is_not_found() -> None:
    async def body(a: Assigner) -> None:
        code, reason, metadata = reason_of(await session_error(a, join("sc-1", "nope")))
        assert (code, reason, metadata) == (
            grpc.StatusCode.NOT_FOUND,
            "GROUP_NOT_FOUND",
            {"group": "nope"},
        )

    run(body)


def test_a_replica_that_does_not_serve_is_not_ready() -> None:
    async def body(a: Assigner) -> None:
        code, reason, _ = reason_of(await session_error(a, join("sc-1", "g")))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


def test_a_just_elected_leader_answers_once_it_has_loaded_its_state() -> None:
    async def body(a: Assigner) -> None:
        a.leader[0] = True  # elected, still loading: the join waits instead of bouncing
        sidecar = Sidecar(a.sessions, "sc-1")
        joined = asyncio.ensure_future(sidecar.join("g"))
        await asyncio.sleep(0.3)
        assert not joined.done()
        await a.create("g")
        a.groups.start_serving()
        accepted = await joined
        assert accepted.session_id
        await sidecar.close()

    run(body, serving=False)


def test_a_session_ends_when_its_group_is_closed() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        await sidecar.grants(4)
        a.groups.stop_serving()
        a.groups.clear()  # leadership lost: every stream of the group ends
        while (message := await asyncio.wait_for(sidecar.call.read(), 5)) is not grpc.aio.EOF:
            assert message.WhichOneof("kind") != "accepted"
        assert await sidecar.call.code() == grpc.StatusCode.OK

    run(body)


# ---- grants whose epoch write is slow or fails (issue 17, path 3) -------------------------

SHORT_LEASES = AssignerSettings(
    grpc_port=0,
    http_port=0,
    lease_ttl_seconds=1.0,
    lease_grace_seconds=0.2,
    heartbeat_interval_seconds=0.25,
)


async def keep_alive(a: Assigner, sidecar: Sidecar) -> None:
    """The assigner's tick (every 0.1 s, as the app runs it) and the sidecar's heartbeats
    naming no lease (no grant has arrived; every 0.2 s, acks not awaited): the member stays
    alive while its grants wait for their epoch write."""
    while True:
        sidecar.seq += 1
        heartbeat = assigner_pb2.SessionHeartbeat(seq=sidecar.seq)
        await sidecar.call.write(assigner_pb2.SessionRequest(heartbeat=heartbeat))
        a.groups.tick()
        await asyncio.sleep(0.1)
        a.groups.tick()
        await asyncio.sleep(0.1)


def test_a_grant_whose_epoch_write_outlasts_its_lease_is_never_sent() -> None:
    """The write of epoch 1 takes longer than TTL + grace: the lease lapses at the assigner
    and the partition is granted again (epoch 2). The late epoch-1 grant must not be sent
    once its write lands: honoured by the sidecar it would overlap the epoch-2 grant."""

    async def body(a: Assigner) -> None:
        await a.create("g", [TOPIC])
        a.store.holding_epochs = True
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        alive = asyncio.create_task(keep_alive(a, sidecar))
        try:
            while len(a.store.held) < 2:  # the first decision lapsed and was decided again
                await asyncio.sleep(0.05)
            a.store.holding_epochs = False
            first, second = a.store.held[:2]
            first.set_result(None)  # the slow write lands at last
            second.set_result(None)
            grants = await sidecar.grants(4)
            assert {g.epoch for g in grants} == {2}, [(g.partition, g.epoch) for g in grants]
            withheld = a.prometheus.get_sample_value(
                "ds_assigner_grants_withheld_total", {"group": "g", "reason": "superseded"}
            )
            assert withheld == 4
        finally:
            alive.cancel()
            await sidecar.close()

    run(body, topics={TOPIC: 4}, settings=SHORT_LEASES)


def test_a_grant_whose_epoch_write_fails_is_decided_again_at_once() -> None:
    """A failed write never sends its grant and does not leave the partition waiting a
    TTL for the unsent lease to lapse: it is taken back and granted again, newer epoch."""

    async def body(a: Assigner) -> None:
        await a.create("g", [TOPIC])
        a.store.holding_epochs = True
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        alive = asyncio.create_task(keep_alive(a, sidecar))
        try:
            while not a.store.held:
                await asyncio.sleep(0.01)
            a.store.holding_epochs = False
            a.store.held[0].set_exception(TimeoutError("epoch write timed out"))
            start = asyncio.get_running_loop().time()
            grants = await sidecar.grants(4)
            waited = asyncio.get_running_loop().time() - start
            assert {g.epoch for g in grants} == {2}, [(g.partition, g.epoch) for g in grants]
            assert waited < a.settings.lease_ttl_seconds, f"re-granted after {waited:.2f} s"
        finally:
            alive.cancel()
            await sidecar.close()

    run(body, topics={TOPIC: 4}, settings=SHORT_LEASES)


# ---- Leave ----------------------------------------------------------------------------------


def test_a_graceful_leave_answers_the_hold_window() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        response = await a.sessions.Leave(
            assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="g", graceful=True)
        )
        assert response.hold_window.ToNanoseconds() == int(a.settings.hold_window_seconds * 1e9)
        assert a.groups.group("g").coordinator.members["sc-1"].leaving
        await sidecar.close()

    run(body)


def test_an_abrupt_leave_keeps_nothing_for_the_sidecar() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        response = await a.sessions.Leave(
            assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="g", graceful=False)
        )
        assert response.hold_window.ToNanoseconds() == 0
        assert a.groups.group("g").coordinator.live_members() == []
        await sidecar.close()

    run(body)


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (assigner_pb2.LeaveRequest(sidecar_id="", group="g"), ("INVALID_FIELD", "sidecar_id")),
        (assigner_pb2.LeaveRequest(sidecar_id="a/b", group="g"), ("INVALID_FIELD", "sidecar_id")),
        (assigner_pb2.LeaveRequest(sidecar_id="sc-1", group=""), ("INVALID_FIELD", "group")),
        (assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="nope"), ("GROUP_NOT_FOUND", "nope")),
        (assigner_pb2.LeaveRequest(sidecar_id="sc-9", group="g"), ("SIDECAR_NOT_FOUND", "sc-9")),
    ],
)
def test_a_bad_leave_is_refused(
    request_: assigner_pb2.LeaveRequest, expected: tuple[str, str]
) -> None:
    codes = {
        "INVALID_FIELD": grpc.StatusCode.INVALID_ARGUMENT,
        "GROUP_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
        "SIDECAR_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    }

    async def body(a: Assigner) -> None:
        await a.create("g")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.sessions.Leave(request_)
        code, reason, metadata = reason_of(caught.value)
        assert (code, reason) == (codes[expected[0]], expected[0])
        assert expected[1] in metadata.values()

    run(body)


def test_leave_while_not_serving_is_not_ready() -> None:
    async def body(a: Assigner) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.sessions.Leave(assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="g"))
        code, reason, _ = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


def test_joins_beyond_the_admission_policy_are_throttled_and_heartbeats_are_not() -> None:
    """Issue 36 item 3: with room for one join, the second is refused UNAVAILABLE
    JOIN_THROTTLED with a retry-after before any of its work is done; the attached sidecar's
    heartbeats are still renewed, and its re-attach (reporting the leases it holds) passes."""
    settings = AssignerSettings(grpc_port=0, http_port=0, join_rate=0.01, join_burst=1)

    async def body(a: Assigner) -> None:
        await a.create("g")
        first = Sidecar(a.sessions, "sc-1")
        await first.join("g")
        grants = await first.grants(4)
        err = await session_error(a, join("sc-3", "g"))
        code, reason, metadata = reason_of(err)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "JOIN_THROTTLED")
        assert 0 < int(metadata["retry_after_ms"]) <= 10_000
        assert retry_after(err) == int(metadata["retry_after_ms"]) / 1000
        assert a.prometheus.get_sample_value("ds_assigner_joins_throttled_total") == 1
        assert "sc-3" not in [m.id for m in a.groups.group("g").coordinator.live_members()]

        ack = await first.heartbeat(grants)
        assert sorted(r.partition for r in ack.renewed_leases) == [0, 1, 2, 3]

        # sc-1's stream breaks; it comes back reporting the lease it holds: admitted.
        await first.close()
        again = Sidecar(a.sessions, "sc-1")
        request = join("sc-1", "g")
        for g in grants:
            request.join.held_leases.add(topic=g.topic, partition=g.partition, epoch=g.epoch)
        await again.call.write(request)
        message = await again.next()
        assert message.WhichOneof("kind") == "accepted", message
        assert a.prometheus.get_sample_value("ds_assigner_joins_throttled_total") == 1
        await again.close()

    run(body, settings=settings)


def test_a_join_storm_beyond_capacity_costs_the_attached_sidecar_nothing() -> None:
    """An attached sidecar heartbeats through a storm of 300 joins at once (room for
    none): every storming join is refused JOIN_THROTTLED with a retry-after (their spread
    is test_admission's); every heartbeat of the attached sidecar renews all four leases it
    holds, and no storming join became a member (nothing to rebalance towards)."""
    settings = AssignerSettings(grpc_port=0, http_port=0, join_rate=0.01, join_burst=1)
    storm = 300

    async def body(a: Assigner) -> None:
        await a.create("g")
        attached = Sidecar(a.sessions, "sc-0")
        await attached.join("g")
        grants = await attached.grants(4)
        held = sorted((g.topic, g.partition) for g in grants)

        async def heartbeats() -> list[assigner_pb2.HeartbeatAck]:
            return [await attached.heartbeat(grants) for _ in range(5)]

        joins = asyncio.gather(*(session_error(a, join(f"storm-{i}", "g")) for i in range(storm)))
        errors, acks = await asyncio.gather(joins, heartbeats())

        assert [reason_of(e)[:2] for e in errors] == [
            (grpc.StatusCode.UNAVAILABLE, "JOIN_THROTTLED")
        ] * storm
        assert all(0 < (retry_after(e) or 0) <= 10 for e in errors)
        assert a.prometheus.get_sample_value("ds_assigner_joins_throttled_total") == storm
        assert len(acks) == 5
        for ack in acks:
            assert sorted((r.topic, r.partition) for r in ack.renewed_leases) == held
        assert [m.id for m in a.groups.group("g").coordinator.live_members()] == ["sc-0"]
        await attached.close()

    run(body, settings=settings)
