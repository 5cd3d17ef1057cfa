"""Client bindings expire when nothing renews them within the binding liveness window
(issue 37, finding 6). Client ids are random per process, so crashed clients (a
crash-looping Deployment, or one reader on purpose) used to fill ``max_clients_per_group``
for good and every new client got ``TOO_MANY_CLIENTS``. A binding lives while its client
keeps a WatchBinding stream open, binds again, or a sidecar reports it reading; otherwise
it is unbound (durably) once the window passes. On the real servicers (``rpc_harness``).
"""

from __future__ import annotations

import asyncio

import grpc

from dataservice.assigner.v1 import assigner_pb2, binding_pb2
from services.assigner.settings import AssignerSettings
from tests.unit.assigner.rpc_harness import Assigner, reason_of, refused, run

WINDOW = 0.5


def test_abandoned_bindings_expire_and_a_new_client_binds() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        for c in ("live", "crashed-1", "crashed-2", "crashed-3"):
            await a.bindings.Bind(binding_pb2.BindRequest(client_id=c, group="g"))
        watch = a.bindings.WatchBinding(
            binding_pb2.WatchBindingRequest(client_id="live", group="g", known_version=0)
        )
        await asyncio.wait_for(watch.read(), 5)  # the live client's watch is open
        new = binding_pb2.BindRequest(client_id="new", group="g")
        code, reason, _ = reason_of(await refused(a.bindings.Bind(new)))
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_CLIENTS")
        await asyncio.sleep(WINDOW * 1.5)
        a.groups.tick()
        group = a.groups.group("g")
        print("bound after the liveness window:", sorted(group.clients))
        await a.bindings.Bind(new)
        assert sorted(group.clients) == ["live", "new"]
        unbound = {w[2] for w in a.store.writes if w[0] == "unbinding"}
        assert unbound == {"crashed-1", "crashed-2", "crashed-3"}, "durably unbound"
        watch.cancel()

    run(body, settings=AssignerSettings(
        grpc_port=0, http_port=0, max_clients_per_group=4, binding_liveness_seconds=WINDOW
    ))  # fmt: skip


def test_a_client_a_sidecar_still_tracks_but_that_does_nothing_expires() -> None:
    """A sidecar reports every client it still tracks in each heartbeat. Only a report of
    a client at work (a stream open there, or more requests than that sidecar's previous
    report) renews its binding: a client killed with kill -9 after reading stayed renewed
    for good (red: 50 killed Go clients all still bound 30 s past a 5 s window)."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        for c in ("killed", "reading", "streaming"):
            await a.bindings.Bind(binding_pb2.BindRequest(client_id=c, group="g"))
        group = a.groups.group("g")

        def report(requests: int) -> None:
            hb = assigner_pb2.SessionHeartbeat(
                clients=[
                    assigner_pb2.ClientActivity(client_id="killed", requests=7),
                    assigner_pb2.ClientActivity(client_id="reading", requests=requests),
                    assigner_pb2.ClientActivity(client_id="streaming", active_streams=1),
                ]
            )
            group._observe_clients("sc-1", hb, group.clock())

        for step in range(4):  # the window passes while the sidecar keeps reporting
            report(requests=10 + step)
            await asyncio.sleep(WINDOW / 2)
        a.groups.tick()
        print("bound after the liveness window:", sorted(group.clients))
        assert sorted(group.clients) == ["reading", "streaming"]

    run(body, settings=AssignerSettings(
        grpc_port=0, http_port=0, binding_liveness_seconds=WINDOW
    ))  # fmt: skip
