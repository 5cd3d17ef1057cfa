"""AdminService's operations on the real servicers (in-process, Kafka at its narrow edges):
ResetOffsets (each bad input, dry runs, leased and kafka_group resets, request_id),
DrainSidecar / UndrainSidecar, and UpdateGroup's mode switch with a sidecar attached.

The sidecars are Session streams driven by the test, so every command the assigner sends
(revokes with their reason and drain, grants with their epoch and start offset) and what
it waits for (releases, Kafka's group emptying) is observed step by step.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, assigner_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.runtime.topic_partition import TopicPartition
from tests.support.rpc_operations import commands, holding, logs, release
from tests.unit.assigner.rpc_harness import (
    TOPIC,
    Assigner,
    Sidecar,
    reason_of,
    refused,
    run,
)

EARLIEST = admin_pb2.RESET_STRATEGY_EARLIEST
NOW_MS = 1_800_000_000_000


def reset(**fields: object) -> admin_pb2.ResetOffsetsRequest:
    fields.setdefault("group", "g")
    fields.setdefault("strategy", EARLIEST)
    return admin_pb2.ResetOffsetsRequest(**fields)  # type: ignore[arg-type]


# ---- ResetOffsets: bad input --------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "code", "reason", "field"),
    [
        (reset(group="nope"), grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", None),
        (reset(group=""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "group"),
        (reset(strategy=0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "strategy"),
        (reset(topics=["nope"]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "topics[0]"),
        (
            reset(targets=[admin_pb2.ResetTarget(topic="nope", partition=0)]),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "targets[0].topic",
        ),
        (
            reset(targets=[admin_pb2.ResetTarget(topic=TOPIC, partition=4)]),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "targets[0].partition",
        ),
        (
            reset(targets=[admin_pb2.ResetTarget(topic=TOPIC, partition=-1)]),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "targets[0].partition",
        ),
        (
            reset(strategy=admin_pb2.RESET_STRATEGY_ABSOLUTE, value=-5),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "value",
        ),
        (
            reset(
                strategy=admin_pb2.RESET_STRATEGY_ABSOLUTE,
                targets=[admin_pb2.ResetTarget(topic=TOPIC, partition=1, value=-1)],
            ),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "targets[0].value",
        ),
        (
            reset(strategy=admin_pb2.RESET_STRATEGY_TIMESTAMP, value=-1),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "value",
        ),
        (
            reset(strategy=admin_pb2.RESET_STRATEGY_TIMESTAMP, value=4_000_000_000_000),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "value",
        ),
        (
            reset(
                targets=[
                    admin_pb2.ResetTarget(topic=TOPIC, partition=1),
                    admin_pb2.ResetTarget(topic=TOPIC, partition=1),
                ]
            ),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", "targets[1]",
        ),
        (reset(request_id="no spaces"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD",
         "request_id"),
    ],
)  # fmt: skip
def test_reset_offsets_refuses_bad_input(
    request_: admin_pb2.ResetOffsetsRequest,
    code: grpc.StatusCode,
    reason: str,
    field: str | None,
) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        got, why, metadata = reason_of(await refused(a.admin.ResetOffsets(request_)))
        assert (got, why) == (code, reason)
        if field is not None:
            assert metadata["field"] == field
        assert a.offsets.commits == [], "a refused reset commits nothing"

    run(body)


def test_a_timestamp_in_the_future_is_named_as_such() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        request = reset(strategy=admin_pb2.RESET_STRATEGY_TIMESTAMP, value=4_000_000_000_000)
        err = await refused(a.admin.ResetOffsets(request))
        assert "in the future" in (err.details() or "")

    run(body)


def test_a_kafka_group_with_members_is_not_reset() -> None:
    async def body(a: Assigner) -> None:
        await a.create("classic", mode="kafka_group")
        logs(a, "classic")
        a.kafka.members["classic"] = 2
        code, reason, metadata = reason_of(
            await refused(a.admin.ResetOffsets(reset(group="classic")))
        )
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "GROUP_NOT_EMPTY")
        assert metadata == {"group": "classic", "members": "2"}
        assert a.offsets.commits == []
        a.kafka.members["classic"] = 0
        done = await a.admin.ResetOffsets(reset(group="classic", request_id="r-1"))
        assert [p.new_offset for p in done.partitions] == [10] * 4
        assert all(p.applied and p.epoch == 0 for p in done.partitions)
        assert a.offsets.commits == [
            ("classic", {TopicPartition(TOPIC, p): (10, 0) for p in range(4)})
        ]

    run(body)


# ---- ResetOffsets: dry run, leased reset, idempotency -------------------------------------


def test_a_dry_run_computes_and_changes_nothing() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        sidecar, _ = await holding(a, "sc-1")
        request = reset(
            strategy=admin_pb2.RESET_STRATEGY_SHIFT_BY, value=-100, dry_run=True,
        )  # fmt: skip
        preview = await a.admin.ResetOffsets(request)
        assert preview.dry_run
        assert [(p.old_offset, p.target_offset, p.new_offset, p.clamped, p.applied) for p in
                preview.partitions] == [(60, -40, 10, True, False)] * 4  # fmt: skip
        assert a.offsets.commits == []
        leases = a.groups.group("g").coordinator.leases.values()
        assert {(lease.holder, lease.state.name) for lease in leases} == {("sc-1", "GRANTED")}
        await sidecar.close()

    run(body)


def test_a_leased_reset_pauses_commits_under_new_epochs_and_gives_back() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        sidecar, grants = await holding(a, "sc-1")
        call = asyncio.ensure_future(a.admin.ResetOffsets(reset(request_id="reset-1")))
        revokes = [m.revoke for m in await commands(sidecar, "revoke", 4)]
        assert {r.reason for r in revokes} == {assigner_pb2.REVOKE_REASON_CONFIG}
        assert {r.drain_timeout.ToNanoseconds() for r in revokes} == {0}, "no drain"
        assert not call.done(), "nothing is committed before the holder released"
        assert a.offsets.commits == []
        await release(sidecar, revokes, committed=70)
        back = [m.grant for m in await commands(sidecar, "grant", 4)]
        done = await call
        assert sorted((g.partition, g.epoch, g.start_offset) for g in back) == [
            (p, 2, 10) for p in range(4)
        ]
        assert [(p.old_offset, p.new_offset, p.epoch, p.applied) for p in done.partitions] == [
            (60, 10, 2, True)
        ] * 4
        assert a.offsets.commits == [("g", {TopicPartition(TOPIC, p): (10, 2) for p in range(4)})]
        epochs = [w for w in a.store.writes if w[0] == "epochs"]
        assert epochs[-1] == ("epochs", "g", *(f"{TOPIC}/{p}@2" for p in range(4)))
        assert {g.epoch for g in grants} == {1}
        # The same request_id again: answered as before, applied once.
        again = await a.admin.ResetOffsets(reset(request_id="reset-1"))
        assert again == done and len(a.offsets.commits) == 1
        await sidecar.close()

    run(body)


def test_a_reset_of_a_group_without_sidecars_commits_and_grants_at_the_new_offsets() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        logs(a)
        a.offsets.by_time[TopicPartition(TOPIC, 2)] = 42
        request = reset(
            strategy=admin_pb2.RESET_STRATEGY_TIMESTAMP, value=NOW_MS - 60_000 - 10**12,
            targets=[admin_pb2.ResetTarget(topic=TOPIC, partition=2)],
        )  # fmt: skip
        done = await a.admin.ResetOffsets(request)
        ((p),) = done.partitions
        assert (p.partition, p.old_offset, p.new_offset, p.epoch) == (2, 60, 42, 1)
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        grants = {g.partition: g for g in await sidecar.grants(4)}
        assert (grants[2].epoch, grants[2].start_offset) == (2, 42)
        assert grants[0].start_offset == -1, "the others start at Kafka's committed offsets"
        await sidecar.close()

    run(body)


def test_a_lease_paused_for_a_reset_cannot_be_moved() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar, _ = await holding(a, "sc-1")
        other = Sidecar(a.sessions, "sc-2")
        await other.join("g")
        group = a.groups.group("g")
        group.apply(group.coordinator.pause([TopicPartition(TOPIC, 0)], 0.0))
        move = admin_pb2.MoveLeaseRequest(
            group="g", topic=TOPIC, partition=0, target_sidecar_id="sc-2"
        )
        code, reason, metadata = reason_of(await refused(a.admin.MoveLease(move)))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OPERATION_IN_PROGRESS")
        assert metadata["operation"] == "an offset reset"
        await sidecar.close()
        await other.close()

    run(body)


# ---- drains -------------------------------------------------------------------------------


def test_a_drain_moves_every_lease_off_and_an_undrain_brings_its_share_back() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        one, _ = await holding(a, "sc-1")
        two = Sidecar(a.sessions, "sc-2")
        await two.join("g")
        moving = [m.revoke for m in await commands(one, "revoke", 2)]
        await release(one, moving, committed=5)
        await two.grants(2)

        drained = await a.admin.DrainSidecar(
            admin_pb2.DrainSidecarRequest(group="g", sidecar_id="sc-1", request_id="d-1")
        )
        assert drained.member.drained and drained.member.sidecar_id == "sc-1"
        assert {lease.state for lease in drained.leases} == {types_pb2.LEASE_STATE_REVOKING}
        revokes = [m.revoke for m in await commands(one, "revoke", 2)]
        await release(one, revokes, committed=7)
        moved = await two.grants(2)
        assert {g.start_offset for g in moved} == {-1}, "what Kafka holds, not the report"
        described = await a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g"))
        assert {m.sidecar_id: m.drained for m in described.members} == {"sc-1": True, "sc-2": False}
        assert {lease.holder for lease in described.leases} == {"sc-2"}
        assert ("drain", "g", "sc-1") in a.store.writes

        undrained = await a.admin.UndrainSidecar(
            admin_pb2.UndrainSidecarRequest(group="g", sidecar_id="sc-1")
        )
        assert not undrained.member.drained
        back = [m.revoke for m in await commands(two, "revoke", 2)]
        await release(two, back, committed=9)
        assert {g.start_offset for g in await one.grants(2)} == {-1}
        assert ("undrain", "g", "sc-1") in a.store.writes
        await one.close()
        await two.close()

    run(body)


def test_drains_refuse_unknown_sidecars_and_kafka_groups() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        await a.create("classic", mode="kafka_group")
        for request, expected in (
            (admin_pb2.DrainSidecarRequest(group="nope", sidecar_id="sc-1"),
             (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND")),
            (admin_pb2.DrainSidecarRequest(group="g", sidecar_id="sc-9"),
             (grpc.StatusCode.NOT_FOUND, "SIDECAR_NOT_FOUND")),
            (admin_pb2.DrainSidecarRequest(group="g", sidecar_id=""),
             (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")),
            (admin_pb2.DrainSidecarRequest(group="classic", sidecar_id="sc-1"),
             (grpc.StatusCode.FAILED_PRECONDITION, "GROUP_MODE_MISMATCH")),
        ):  # fmt: skip
            assert reason_of(await refused(a.admin.DrainSidecar(request)))[:2] == expected
        undrain = admin_pb2.UndrainSidecarRequest(group="g", sidecar_id="sc-9")
        assert reason_of(await refused(a.admin.UndrainSidecar(undrain)))[:2] == (
            grpc.StatusCode.NOT_FOUND,
            "SIDECAR_NOT_FOUND",
        )

    run(body)


# ---- mode switch --------------------------------------------------------------------------


def to_mode(mode: int, version: int = 0) -> admin_pb2.UpdateGroupRequest:
    return admin_pb2.UpdateGroupRequest(
        group=types_pb2.GroupConfig(name="g", mode=mode),  # type: ignore[arg-type]
        update_mask=field_mask_pb2.FieldMask(paths=["mode"]),
        expected_config_version=version,
    )


async def ended(sidecar: Sidecar) -> None:
    """The assigner ended the sidecar's session (the sidecar then re-joins)."""
    while True:
        message = await asyncio.wait_for(sidecar.call.read(), 5)
        if message is grpc.aio.EOF:
            return


def test_switching_modes_with_a_sidecar_attached_hands_every_lease_over() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar, _ = await holding(a, "sc-1")
        call = asyncio.ensure_future(
            a.admin.UpdateGroup(to_mode(common_pb2.GROUP_MODE_KAFKA_GROUP, version=1))
        )
        revokes = [m.revoke for m in await commands(sidecar, "revoke", 4)]
        assert {r.reason for r in revokes} == {assigner_pb2.REVOKE_REASON_CONFIG}
        assert {r.drain_timeout.ToNanoseconds() for r in revokes} == {5 * 10**9}, "drained"
        assert not call.done()
        await release(sidecar, revokes, committed=50)
        switched = await call
        assert switched.group.mode == common_pb2.GROUP_MODE_KAFKA_GROUP
        assert a.store.records["g"].mode == "kafka_group"
        await ended(sidecar)
        sidecar = Sidecar(a.sessions, "sc-1")
        assert (await sidecar.join("g")).mode == common_pb2.GROUP_MODE_KAFKA_GROUP

        # Back: granted only once Kafka's group is empty, each at its committed offset.
        a.kafka.members["g"] = 1
        call = asyncio.ensure_future(a.admin.UpdateGroup(to_mode(common_pb2.GROUP_MODE_LEASED)))
        await ended(sidecar)
        sidecar = Sidecar(a.sessions, "sc-1")
        assert (await sidecar.join("g")).mode == common_pb2.GROUP_MODE_LEASED
        await asyncio.sleep(0.7)
        assert not call.done(), "Kafka's group still has a member"
        assert all(le.holder is None for le in a.groups.group("g").coordinator.leases.values())
        a.kafka.members["g"] = 0
        grants = await sidecar.grants(4)
        assert {g.start_offset for g in grants} == {-1}
        assert {g.epoch for g in grants} == {2}
        assert (await call).group.mode == common_pb2.GROUP_MODE_LEASED
        await sidecar.close()

    run(body)


def test_a_reset_waits_for_no_mode_switch() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar, _ = await holding(a, "sc-1")
        switch = asyncio.ensure_future(
            a.admin.UpdateGroup(to_mode(common_pb2.GROUP_MODE_KAFKA_GROUP))
        )
        await commands(sidecar, "revoke", 4)
        code, reason, metadata = reason_of(await refused(a.admin.ResetOffsets(reset())))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "OPERATION_IN_PROGRESS")
        assert metadata["operation"] == "a mode switch"
        switch.cancel()
        await sidecar.close()

    run(body)
