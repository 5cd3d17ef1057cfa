"""AdminService.DeleteGroup on the real servicers (in-process, the state topic in memory):
refused while clients are bound unless forced (the clients named), durable before the group
goes, epochs kept for a group created again, bad input, and the admin role required."""

from __future__ import annotations

import grpc

from dataservice.assigner.v1 import admin_pb2, binding_pb2
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.rpc_harness import TOPIC, Assigner, Sidecar, reason_of, refused, run


def delete(**fields: object) -> admin_pb2.DeleteGroupRequest:
    fields.setdefault("group", "g")
    return admin_pb2.DeleteGroupRequest(**fields)  # type: ignore[arg-type]


def test_a_group_with_bound_clients_is_kept_unless_forced() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        for client in ("app-2", "app-1"):
            await a.bindings.Bind(binding_pb2.BindRequest(client_id=client, group="g"))
        code, reason, metadata = reason_of(await refused(a.admin.DeleteGroup(delete())))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "GROUP_HAS_CLIENTS")
        assert metadata == {"group": "g", "clients": "app-1,app-2", "client_count": "2"}
        assert a.groups.names() == ["g"] and "g" in a.store.records
        done = await a.admin.DeleteGroup(delete(force=True, request_id="d-1"))
        assert list(done.unbound_clients) == ["app-1", "app-2"]
        assert done.group.name == "g" and done.group.config_version == 1
        assert a.groups.names() == [] and "g" not in a.store.records
        assert a.store.writes[-1] == ("delete", "g", "app-1", "app-2")
        # The same request_id again answers the first result; a new one: NOT_FOUND.
        again = await a.admin.DeleteGroup(delete(force=True, request_id="d-1"))
        assert list(again.unbound_clients) == ["app-1", "app-2"]
        code, reason, _ = reason_of(await refused(a.admin.DeleteGroup(delete())))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND")

    run(body)


def test_a_group_without_clients_goes_and_its_sessions_end() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        grants = await sidecar.grants(4)
        done = await a.admin.DeleteGroup(delete())
        assert list(done.unbound_clients) == []
        assert a.groups.get("g") is None
        # Created again: its epochs go on from the deleted group's, never back.
        await a.create("g")
        group = a.groups.group("g")
        before = {TopicPartition(TOPIC, g.partition): g.epoch for g in grants}
        assert all(group.coordinator.leases[tp].epoch >= e for tp, e in before.items())
        await sidecar.close()

    run(body)


def test_nothing_changes_when_the_state_topic_cannot_be_written() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        a.store.failing = True
        code, reason, _ = reason_of(await refused(a.admin.DeleteGroup(delete())))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "KAFKA_UNAVAILABLE")
        assert a.groups.names() == ["g"]

    run(body)


def test_bad_input_is_refused() -> None:
    async def body(a: Assigner) -> None:
        cases = ((delete(group=""), "group"), (delete(request_id="x y"), "request_id"))
        for request, field in cases:
            code, reason, metadata = reason_of(await refused(a.admin.DeleteGroup(request)))
            assert (code, reason, metadata.get("field")) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "INVALID_FIELD",
                field,
            )

    run(body)
