"""BindingService (Bind, WatchBinding, Unbind) on an in-process server: request
validation, error mapping (status code + ErrorInfo reason) and the happy path, without a
Kafka broker."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dataservice.assigner.v1 import binding_pb2
from tests.unit.assigner.rpc_harness import (
    TOPIC,
    Assigner,
    Sidecar,
    field_error,
    reason_of,
    run,
    stream_refused,
)

BAD_CLIENT_IDS = ["", "has space", "a/b", "x" * 256]


# ---- Bind ---------------------------------------------------------------------------------


def test_bind_answers_the_sidecars_serving_the_group_and_stores_the_binding() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        await sidecar.grants(4)
        response = await a.bindings.Bind(binding_pb2.BindRequest(client_id="app-1", group="g"))
        binding = response.binding
        assert (binding.client_id, binding.group) == ("app-1", "g")
        assert [(e.sidecar_id, e.address) for e in binding.endpoints] == [("sc-1", "sc-1.pod:7080")]
        assert sorted(p.partition for p in binding.endpoints[0].partitions) == [0, 1, 2, 3]
        assert all(p.topic == TOPIC for p in binding.endpoints[0].partitions)
        assert a.groups.group("g").clients == {"app-1"}
        await asyncio.sleep(0)  # the binding's write is tracked in the background
        assert ("binding", "g", "app-1") in a.store.writes
        await sidecar.close()

    run(body)


@pytest.mark.parametrize("client_id", BAD_CLIENT_IDS)
def test_bind_refuses_a_bad_client_id(client_id: str) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Bind(binding_pb2.BindRequest(client_id=client_id, group="g"))
        assert field_error(caught.value) == "client_id"

    run(body)


def test_bind_to_an_unknown_or_unnamed_group_is_refused() -> None:
    async def body(a: Assigner) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Bind(binding_pb2.BindRequest(client_id="app-1", group="nope"))
        assert reason_of(caught.value) == (
            grpc.StatusCode.NOT_FOUND,
            "GROUP_NOT_FOUND",
            {"group": "nope"},
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Bind(binding_pb2.BindRequest(client_id="app-1", group=""))
        assert field_error(caught.value) == "group"

    run(body)


def test_bind_while_not_serving_is_not_ready() -> None:
    async def body(a: Assigner) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Bind(binding_pb2.BindRequest(client_id="app-1", group="g"))
        code, reason, _ = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


# ---- WatchBinding -------------------------------------------------------------------------


def test_watch_pushes_each_change_of_the_serving_sidecars() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=0)
        )
        first = await asyncio.wait_for(watch.read(), 5)
        assert first.binding.client_id == "app-1"
        assert list(first.binding.endpoints) == []
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        pushed = await asyncio.wait_for(watch.read(), 5)
        assert pushed.binding.client_id == "app-1"
        assert pushed.binding.version > first.binding.version
        assert [e.sidecar_id for e in pushed.binding.endpoints] == ["sc-1"]
        watch.cancel()
        await sidecar.close()

    run(body)


def test_watch_with_version_zero_gets_the_current_binding_at_once() -> None:
    """0 means "I have none" (binding.proto), even while the group's version is 0 itself."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        assert a.groups.group("g").bindings.version == 0
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=0)
        )
        first = await asyncio.wait_for(watch.read(), 5)
        assert (first.binding.client_id, first.binding.group) == ("app-1", "g")
        watch.cancel()

    run(body)


def test_watch_refuses_a_negative_known_version() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=-1)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await watch.read()
        assert field_error(caught.value) == "known_version"

    run(body)


def test_watch_with_the_current_version_waits_for_the_next_change() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        first = Sidecar(a.sessions, "sc-0")
        await first.join("g")
        current = a.groups.group("g").bindings.version
        assert current >= 1
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=current)
        )
        read = asyncio.ensure_future(watch.read())
        await asyncio.sleep(0.3)
        assert not read.done()  # nothing new to tell the client
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        pushed = await asyncio.wait_for(read, 5)
        assert pushed.binding.version == current + 1
        assert [e.sidecar_id for e in pushed.binding.endpoints] == ["sc-0", "sc-1"]
        watch.cancel()
        await sidecar.close()
        await first.close()

    run(body)


def test_watch_ends_unavailable_when_the_replica_stops_serving_the_group() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=0)
        )
        await asyncio.wait_for(watch.read(), 5)
        a.groups.stop_serving()
        a.groups.clear()  # leadership lost: the client must re-watch the leader
        code, reason, _ = reason_of(await stream_refused(watch))
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body)


@pytest.mark.parametrize("client_id", BAD_CLIENT_IDS)
def test_watch_refuses_a_bad_client_id(client_id: str) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id=client_id, group="g")
        )
        assert field_error(await stream_refused(watch)) == "client_id"

    run(body)


def test_watch_of_an_unknown_group_is_not_found() -> None:
    async def body(a: Assigner) -> None:
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="nope")
        )
        code, reason, _ = reason_of(await stream_refused(watch))
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND")

    run(body)


# ---- Unbind -------------------------------------------------------------------------------


def test_unbind_forgets_the_client_durably() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        await a.bindings.Bind(binding_pb2.BindRequest(client_id="app-1", group="g"))
        await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app-1", group="g"))
        assert a.groups.group("g").clients == set()
        await asyncio.sleep(0)
        assert ("unbinding", "g", "app-1") in a.store.writes
        # Unbinding a client that is not bound is not an error (a retried Unbind).
        await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app-1", group="g"))

    run(body)


@pytest.mark.parametrize("client_id", BAD_CLIENT_IDS)
def test_unbind_refuses_a_bad_client_id(client_id: str) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id=client_id, group="g"))
        assert field_error(caught.value) == "client_id"

    run(body)


def test_unbind_from_an_unknown_group_is_not_found_and_not_ready_when_not_serving() -> None:
    async def body(a: Assigner) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app-1", group="nope"))
        code, reason, _ = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND")
        a.groups.stop_serving()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app-1", group="nope"))
        code, reason, _ = reason_of(caught.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body)
