"""BindingService's caps (ARCHITECTURE §8: every list and queue a caller can grow has
one): bound clients per group, WatchBinding streams per group, and each stream's queue —
a watcher that falls behind is dropped, and the client library watches again."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from dataservice.assigner.v1 import binding_pb2, types_pb2
from dsclient.binding import BindingKeeper
from services.assigner.bindings import DROPPED
from services.assigner.settings import AssignerSettings
from tests.unit.assigner.rpc_harness import Assigner, Sidecar, reason_of, run, stream_refused

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def settings(**caps: int) -> AssignerSettings:
    return AssignerSettings(grpc_port=0, http_port=0, **caps)  # type: ignore[arg-type]


def bind(a: Assigner, client_id: str) -> object:
    return a.bindings.Bind(binding_pb2.BindRequest(client_id=client_id, group="g"))


def test_bind_past_the_cap_of_clients_is_resource_exhausted() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        await bind(a, "app-1")
        await bind(a, "app-2")
        await bind(a, "app-1")  # binding again is not a new client
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await bind(a, "app-3")
        assert reason_of(caught.value) == (
            EXHAUSTED,
            "TOO_MANY_CLIENTS",
            {"group": "g", "limit": "2"},
        )
        assert a.groups.group("g").clients == {"app-1", "app-2"}
        await a.bindings.Unbind(binding_pb2.UnbindRequest(client_id="app-1", group="g"))
        await bind(a, "app-3")  # room again

    run(body, settings=settings(max_clients_per_group=2))


def test_watch_past_the_cap_of_watchers_is_resource_exhausted() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        request = binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=0)
        first = a.bindings.WatchBinding(request)
        await asyncio.wait_for(first.read(), 5)
        second = a.bindings.WatchBinding(request)
        assert reason_of(await stream_refused(second)) == (
            EXHAUSTED,
            "TOO_MANY_WATCHERS",
            {"group": "g", "limit": "1"},
        )
        first.cancel()
        await asyncio.sleep(0.2)
        third = a.bindings.WatchBinding(request)  # the first one's place is free again
        await asyncio.wait_for(third.read(), 5)
        third.cancel()

    run(body, settings=settings(max_watchers_per_group=1))


def test_a_watcher_that_falls_behind_is_dropped_and_told_so() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        group = a.groups.group("g")
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="app-1", group="g", known_version=0)
        )
        await asyncio.wait_for(watch.read(), 5)
        (queue,) = group.bindings.watchers
        # Three bindings before the stream's handler runs again: one more than its queue.
        for version in (101, 102, 103):
            group.bindings.tell_watchers(types_pb2.Binding(group="g", version=version))
        assert group.bindings.watchers == set()
        assert queue.qsize() == 1 and queue.get_nowait().version == DROPPED
        queue.put_nowait(types_pb2.Binding(group="g", version=DROPPED))
        code, reason, metadata = reason_of(await stream_refused(watch))
        assert (code, reason, metadata) == (
            EXHAUSTED,
            "WATCHER_TOO_SLOW",
            {"group": "g", "limit": "2"},
        )
        dropped = a.prometheus.get_sample_value(
            "ds_assigner_binding_watchers_dropped_total", {"group": "g"}
        )
        assert dropped == 1.0

    run(body, settings=settings(watch_queue_max=2))


def test_the_client_library_watches_again_after_being_dropped() -> None:
    """DsClient's binding keeper treats WATCHER_TOO_SLOW like any broken watch: it
    watches again with its known version and gets the bindings it missed."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        keeper = await asyncio.to_thread(
            BindingKeeper,
            "g",
            "app-1",
            assigner=a.address,
            consul=None,
            leader_key="",
            lock=threading.Lock(),
        )
        try:
            group = a.groups.group("g")
            deadline = time.monotonic() + 5
            while not group.bindings.watchers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for version in range(1, 4):  # past the queue of 2: the keeper's watch is dropped
                group.bindings.tell_watchers(types_pb2.Binding(group="g", version=-100 - version))
            assert group.bindings.watchers == set()
            sidecar = Sidecar(a.sessions, "sc-1")
            await sidecar.join("g")
            await sidecar.grants(4)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "sc-1.pod:7080" not in keeper.sidecars:
                await asyncio.sleep(0.1)
            assert list(keeper.sidecars) == ["sc-1.pod:7080"]
            assert len(group.bindings.watchers) == 1  # watching again
            await sidecar.close()
        finally:
            await asyncio.to_thread(keeper.close)

    run(body, settings=settings(watch_queue_max=2))
