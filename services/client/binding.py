"""The client's binding to its group's sidecars, kept current through the assigner.

:class:`BindingKeeper` binds the client through the assigner, keeps a ``WatchBinding``
stream open on a background thread (a new binding is pushed the moment a sidecar leaves),
opens a channel to each bound sidecar and closes those no longer bound. It follows the
assigner's leader (ARCHITECTURE §3 "Leaders"): a follower answers ``FAILED_PRECONDITION``
with the leader's address in trailing metadata ``ds-leader`` and the keeper switches to it
at once; given Consul, it also follows the leader key with blocking queries. Calls that
may fail over (the assigner's, and the client's acks) go through :meth:`retrying`, which
retries ``UNAVAILABLE`` only (AIP-194).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import structlog

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from dataservice.sidecar.v1 import stream_pb2_grpc
from services.client.errors import ClientError
from services.client.sidecar import Sidecar
from services.runtime.errors import LEADER_METADATA_KEY, Reason, error_info, trailing_value
from services.runtime.grpcserver import CHANNEL_OPTIONS
from services.runtime.leader_watch import LeaderWatchThread

log = structlog.get_logger(__name__)

T = TypeVar("T")

# After a leader change, a binding without sidecars is the new leader still gathering its
# sidecars' re-joins: keep using the old ones this long rather than stop fetching.
EMPTY_BINDING_GRACE_SECONDS = 10.0


class BindingKeeper:
    """Which sidecars serve the client's group, kept current; and the calls to the assigner.

    :attr:`sidecars` (address → :class:`Sidecar`) is guarded by the lock the owner passes
    in, so the owner can read it together with state of its own. :attr:`changed` is set
    whenever a binding is applied; :attr:`closed` once :meth:`close` begins."""

    def __init__(
        self,
        group: str,
        client_id: str,
        *,
        assigner: str,
        consul: str | None,
        leader_key: str,
        lock: threading.Lock,
    ) -> None:
        """Binds at once (retrying as :meth:`retrying` does), then starts the watch thread
        and, given ``consul``, the leader watch."""
        self.group = group
        self.client_id = client_id
        self._leader_watch: LeaderWatchThread | None = None
        if consul:
            self._leader_watch = LeaderWatchThread(consul, self._on_leader, key=leader_key)
            assigner = self._leader_watch.current() or assigner
        self.assigner = assigner
        self._lock = lock
        self.sidecars: dict[str, Sidecar] = {}
        self._binding_version = 0
        self.closed = threading.Event()
        self.changed = threading.Event()
        self._assigner_lock = threading.Lock()
        self._wake_watch = threading.Event()  # close() or a leader change
        self._watch_call: grpc.Call | None = None
        self._leader_changed_at: float | None = None
        self._assigner_channel = grpc.insecure_channel(assigner, options=CHANNEL_OPTIONS)
        self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
        self._watched_assigner = self.assigner
        self._apply_binding(self._call_assigner(self._bind))
        self._watcher = threading.Thread(target=self._watch, name="ds-binding-watch", daemon=True)
        self._watcher.start()
        if self._leader_watch is not None:
            self._leader_watch.start()

    def close(self) -> None:
        """Stop following, unbind (best effort, 2 s) and close every channel."""
        self.closed.set()
        self._wake_watch.set()
        if self._leader_watch is not None:
            self._leader_watch.stop()
        with contextlib.suppress(grpc.RpcError):
            self._binding_stub.Unbind(
                binding_pb2.UnbindRequest(client_id=self.client_id, group=self.group), timeout=2
            )
        self._assigner_channel.close()
        with self._lock:
            for sidecar in self.sidecars.values():
                sidecar.channel.close()
            self.sidecars.clear()

    # ---- binding ----------------------------------------------------------------------

    def _bind(self) -> types_pb2.Binding:
        request = binding_pb2.BindRequest(client_id=self.client_id, group=self.group)
        return self._binding_stub.Bind(request, timeout=10).binding

    def _watch(self) -> None:
        backoff = 0.1
        while not self.closed.is_set():
            try:
                if self.assigner != self._watched_assigner:
                    self._rebind()
                request = binding_pb2.WatchBindingRequest(
                    client_id=self.client_id, group=self.group, known_version=self._binding_version
                )
                call = self._binding_stub.WatchBinding(request)
                self._watch_call = call
                if self.assigner != self._watched_assigner:
                    # The leader moved while we were connecting.
                    call.cancel()  # type: ignore[no-untyped-call]
                for response in call:
                    self._apply_binding(response.binding)
                    backoff = 0.1
            except (grpc.RpcError, ClientError, ValueError) as err:
                # ValueError: the channel was closed under us (a leader switch, or close()).
                if self.closed.is_set():
                    return
                if isinstance(err, grpc.RpcError):
                    self._follow_leader(err)
                log.debug("binding watch broken; re-watching", error=str(err))
            finally:
                self._watch_call = None
            if self.assigner != self._watched_assigner:
                continue  # a new leader: re-bind there at once
            self._wake_watch.wait(backoff * (0.5 + random.random()))
            self._wake_watch.clear()
            backoff = min(backoff * 2, 5.0)

    def _rebind(self) -> None:
        """Bind on a new leader. Binding versions of different leaders are not comparable
        (until assigner state is shared), so the new leader's binding replaces ours."""
        assigner = self.assigner
        binding = self._call_assigner(self._bind)
        self._watched_assigner = assigner
        with self._lock:
            self._binding_version = 0
        self._apply_binding(binding)

    def _apply_binding(self, binding: types_pb2.Binding) -> None:
        with self._lock:
            if binding.version and binding.version < self._binding_version:
                return
            moved = self._leader_changed_at
            if (
                not binding.endpoints
                and self.sidecars
                and moved is not None
                and time.monotonic() - moved < EMPTY_BINDING_GRACE_SECONDS
            ):
                # Keep fetching from the sidecars we know; the new leader pushes them
                # again as they re-join. Its version still counts, so the watch goes on.
                self._binding_version = binding.version
                return
            self._binding_version = binding.version
            wanted = {e.address: e for e in binding.endpoints}
            for address in list(self.sidecars):
                if address not in wanted:
                    self.sidecars.pop(address).channel.close()
            for address, endpoint in wanted.items():
                sidecar = self.sidecars.get(address)
                if sidecar is None:
                    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                    sidecar = Sidecar(address, channel, stream_pb2_grpc.StreamServiceStub(channel))
                    self.sidecars[address] = sidecar
                sidecar.partitions = {(tp.topic, tp.partition) for tp in endpoint.partitions}
        log.debug("binding", version=binding.version, endpoints=sorted(wanted))
        self.changed.set()

    def _follow_leader(self, err: grpc.RpcError) -> bool:
        """Switch to the leader a follower named; True if there was one to switch to."""
        leader = trailing_value(err, LEADER_METADATA_KEY)
        if leader:
            self._switch_assigner(leader)
            return True
        return False

    def _on_leader(self, leader: str | None) -> None:
        """The Consul leader watch saw a new leader (runs on the watch thread)."""
        if leader:
            self._switch_assigner(leader)

    def _switch_assigner(self, leader: str) -> None:
        with self._assigner_lock:
            if leader == self.assigner or self.closed.is_set():
                return
            log.info("following the assigner leader", leader=leader, old=self.assigner)
            old = self._assigner_channel
            self._assigner_channel = grpc.insecure_channel(leader, options=CHANNEL_OPTIONS)
            self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
            self.assigner = leader
            self._leader_changed_at = time.monotonic()
            call = self._watch_call
        if call is not None:
            # The watch thread re-binds on the new leader at once.
            call.cancel()  # type: ignore[no-untyped-call]
        self._wake_watch.set()
        old.close()

    def _leader_from_consul(self) -> None:
        """Read the leader key now (after an assigner call failed)."""
        if self._leader_watch is None:
            return
        with contextlib.suppress(Exception):
            if leader := self._leader_watch.current():
                self._switch_assigner(leader)

    # ---- calls ------------------------------------------------------------------------

    def _call_assigner(self, fn: Callable[[], types_pb2.Binding]) -> types_pb2.Binding:
        return self.retrying(fn, assigner=True)

    def retrying(self, fn: Callable[[], T], attempts: int = 8, *, assigner: bool = False) -> T:
        """Retry UNAVAILABLE with jittered backoff (AIP-194), and a follower's redirect to
        the leader; any other status is the caller's problem and raises ClientError.

        ``fn`` must look the stub up when called (``self._binding_stub``), so a retry after
        a redirect goes to the new leader. For assigner calls, ``NOT_LEADER`` from a
        follower that does not know the leader yet (mid-election) is retried like
        UNAVAILABLE, and with Consul the leader key is read again before each retry."""
        backoff = 0.05
        for attempt in range(attempts):
            try:
                return fn()
            except ValueError:
                # "Cannot invoke RPC on closed channel": a leader switch replaced the
                # channel between looking the stub up and calling it. Retry on the new one.
                if self.closed.is_set() or attempt == attempts - 1:
                    raise
                continue
            except grpc.RpcError as err:
                last = attempt == attempts - 1
                if not last and self._follow_leader(err):
                    continue
                code = err.code()
                info = error_info(err)
                electing = assigner and info is not None and info.reason == Reason.NOT_LEADER.value
                if code != grpc.StatusCode.UNAVAILABLE and not electing:
                    raise ClientError(f"{code.name}: {err.details()}") from err
                if last:
                    if electing:
                        raise ClientError(f"{code.name}: {err.details()}") from err
                    raise
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
                if assigner:
                    self._leader_from_consul()
        raise AssertionError("unreachable")
