"""One group's client bindings: which clients are bound (durable, capped), their liveness
(renewed by a Bind, an open WatchBinding stream or a sidecar's report; issue 37, finding 6),
the WatchBinding streams' bounded queues, and the :class:`Binding` each client is given.

A new binding version is published to every watcher whenever the group's holders change
(:meth:`GroupBindings.publish_if_changed`). The group's live state
(:class:`~services.assigner.groups.GroupRuntime`) owns one and tells it what the coordinator
decided; this module decides nothing about leases. Everything runs on the asyncio loop;
nothing blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import structlog

from dataservice.assigner.v1 import types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.coordinator import MemberInfo
from services.assigner.fault_emitters import GroupFaults
from services.assigner.metrics import AssignerMetrics
from services.assigner.settings import AssignerSettings
from services.runtime.topic_partition import TopicPartition

# Versions of the sentinel bindings a watcher's queue may end with.
CLOSED = -1  # the group was closed here: re-watch the leader
DROPPED = -2  # the watcher fell watch_queue_max behind

Holders = dict[str, tuple[TopicPartition, ...]]


def replace_with(queue: asyncio.Queue[types_pb2.Binding], last: types_pb2.Binding) -> None:
    """Empty ``queue`` and leave ``last`` in it: what its watcher reads next."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(last)


class GroupBindings:
    """The bindings of the group ``name``. ``store(client_id, bound)`` makes a binding or
    an unbinding durable; ``members()`` and ``holders()`` are the group's serving members
    and the partitions each holds, as the coordinator has them now."""

    def __init__(
        self,
        name: str,
        settings: AssignerSettings,
        metrics: AssignerMetrics,
        faults: GroupFaults,
        *,
        clients: Iterable[str],
        store: Callable[[str, bool], None],
        members: Callable[[], Iterable[MemberInfo]],
        holders: Callable[[], Holders],
        clock: Callable[[], float],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.name = name
        self.settings = settings
        self.metrics = metrics
        self.faults = faults
        self.clock = clock
        self.log = log
        self._store = store
        self._members = members
        self._holders = holders
        self.clients: set[str] = set(clients)
        # When each bound client was last renewed (Bind, a sidecar's report; restored ones
        # from now) and its open watches.
        self.client_seen: dict[str, float] = dict.fromkeys(self.clients, clock())
        self.watching: dict[str, int] = {}
        self.next_sweep = 0.0
        self.watchers: set[asyncio.Queue[types_pb2.Binding]] = set()
        self.version = 0
        self.holders_seen: Holders = {}
        # Observability only: the sidecars the group's clients were last bound to, and
        # when each client bound (wall clock, as this replica saw it; bindings restored at
        # election have none).
        self._bound_sidecars: frozenset[str] | None = None
        self.bound_since: dict[str, float] = {}
        self.metrics.bindings.labels(name).set(len(self.clients))

    def bind(self, client_id: str) -> None:
        """Bind ``client_id`` (durable); RESOURCE_EXHAUSTED TOO_MANY_CLIENTS for a new
        client past the group's cap (a client already bound binds again freely)."""
        limit = self.settings.max_clients_per_group
        if client_id not in self.clients and len(self.clients) >= limit:
            raise DsError(
                Reason.TOO_MANY_CLIENTS,
                f"group {self.name!r} has {len(self.clients)} bound clients, the most allowed",
                metadata={"group": self.name, "limit": str(limit)},
            )
        self.client_seen[client_id] = self.clock()
        if client_id not in self.clients:
            self.clients.add(client_id)
            self.bound_since[client_id] = time.time()
            self._store(client_id, True)
            self.metrics.bindings.labels(self.name).set(len(self.clients))

    def unbind(self, client_id: str) -> None:
        self.client_seen.pop(client_id, None)
        if client_id in self.clients:
            self.clients.discard(client_id)
            self.bound_since.pop(client_id, None)
            self._store(client_id, False)
            self.metrics.bindings.labels(self.name).set(len(self.clients))

    def renew(self, client_id: str, now: float) -> None:
        """A sidecar reported ``client_id``: its binding lives on."""
        self.client_seen[client_id] = now

    def watch_started(self, client_id: str) -> None:
        """A WatchBinding stream of ``client_id`` opened: its binding lives while it is."""
        self.watching[client_id] = self.watching.get(client_id, 0) + 1

    def watch_ended(self, client_id: str) -> None:
        left = self.watching.get(client_id, 0) - 1
        if left > 0:
            self.watching[client_id] = left
        else:
            self.watching.pop(client_id, None)
            if client_id in self.clients:  # its window runs from the end of its watch
                self.client_seen[client_id] = self.clock()

    def expire(self, now: float) -> list[str]:
        """Unbind every client nothing renewed within ``binding_liveness_seconds`` (no
        open watch, no Bind, no sidecar report); the clients unbound. Swept at most every
        quarter window (O(bound clients))."""
        window = self.settings.binding_liveness_seconds
        if now < self.next_sweep:
            return []
        self.next_sweep = now + min(window / 4, 5.0)
        expired = [
            c
            for c in self.clients
            if c not in self.watching and now - self.client_seen.get(c, now) > window
        ]
        for client_id in expired:
            self.unbind(client_id)
        if expired:
            self.log.info(
                "bindings expired: not renewed within the binding liveness window",
                clients=len(expired),
                window_seconds=window,
            )
        return expired

    def open_watch(self) -> asyncio.Queue[types_pb2.Binding]:
        """A bounded queue of the group's new bindings for one WatchBinding stream;
        RESOURCE_EXHAUSTED TOO_MANY_WATCHERS past the group's cap. A watcher whose queue
        is full is dropped: its queue then holds only ``DROPPED``."""
        limit = self.settings.max_watchers_per_group
        if len(self.watchers) >= limit:
            raise DsError(
                Reason.TOO_MANY_WATCHERS,
                f"group {self.name!r} has {len(self.watchers)} WatchBinding streams, the most "
                "allowed",
                metadata={"group": self.name, "limit": str(limit)},
            )
        queue: asyncio.Queue[types_pb2.Binding] = asyncio.Queue(self.settings.watch_queue_max)
        self.watchers.add(queue)
        return queue

    def close_watch(self, queue: asyncio.Queue[types_pb2.Binding]) -> None:
        self.watchers.discard(queue)

    def tell_watchers(self, binding: types_pb2.Binding) -> None:
        """Queue ``binding`` for every watcher; one that is ``watch_queue_max`` behind is
        dropped (told so, and forgotten) rather than let its queue grow."""
        for queue in list(self.watchers):
            try:
                queue.put_nowait(binding)
            except asyncio.QueueFull:
                self.watchers.discard(queue)
                replace_with(queue, types_pb2.Binding(group=self.name, version=DROPPED))
                self.metrics.watchers_dropped.labels(self.name).inc()
                self.log.warning("slow binding watcher dropped", queued=queue.maxsize)

    def close(self) -> None:
        """The group is closed here: every watcher is told to re-watch the leader."""
        for queue in list(self.watchers):
            replace_with(queue, types_pb2.Binding(group=self.name, version=CLOSED))

    def binding_for(self, client_id: str) -> types_pb2.Binding:
        holders = self._holders()
        endpoints = [
            types_pb2.SidecarEndpoint(
                sidecar_id=member.id,
                address=member.endpoint,
                local_address=member.local_endpoint,
                zone=member.zone or "",
                partitions=[
                    common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                    for tp in holders.get(member.id, ())
                ],
            )
            for member in self._members()
        ]
        return types_pb2.Binding(
            client_id=client_id, group=self.name, version=self.version, endpoints=endpoints
        )

    def publish_if_changed(self, holders: Holders) -> None:
        """The group's holders are ``holders`` now: a new binding version for every
        watcher if they changed (a rebind, counted per bound client)."""
        if holders == self.holders_seen:
            return
        self.holders_seen = holders
        self.version += 1
        self.faults.rebound(holders, len(self.clients))
        serving = frozenset(holders)
        if self._bound_sidecars is not None and serving != self._bound_sidecars:
            self.metrics.rebinds.labels(self.name).inc(len(self.clients))
        self._bound_sidecars = serving
        if self.watchers:
            self.tell_watchers(self.binding_for(""))
