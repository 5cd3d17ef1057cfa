"""The client's binding to its group's sidecars, kept current through the assigner.

:class:`BindingKeeper` binds the client through the assigner, keeps a ``WatchBinding``
stream open on a background thread (a new binding is pushed the moment a sidecar leaves),
opens a channel to each bound sidecar and closes those no longer bound. It follows the
assigner's leader (ARCHITECTURE §3 "Leaders"): a follower answers ``FAILED_PRECONDITION``
with the leader's address in trailing metadata ``ds-leader`` and the keeper switches to it
at once; given Consul, it also follows the leader key with blocking queries. Both are the
runtime's connection module's (:class:`~dsclient.connection.LeaderFollower`): the
keeper keeps its own watch loop, and re-binds on the new leader when the follower switches.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from dataservice.sidecar.v1 import stream_pb2_grpc
from dsclient.connection import (
    DEFAULT_SETTINGS,
    AssignerTarget,
    CallPolicy,
    ConnectionSettings,
    LeaderFollower,
    open_channel,
)
from dsclient.errors import ClientError
from dsclient.sidecar import Sidecar
from dsclient.transport import sidecar_target

log = logging.getLogger(__name__)

T = TypeVar("T")
Binding = binding_pb2_grpc.BindingServiceStub

# The client's calls: 8 attempts, backing off from 50 ms to 2 s; an election in progress
# (NOT_LEADER without a leader) is waited out like UNAVAILABLE.
CALLS = CallPolicy(attempts=8)

# A watch (or the re-bind on a new leader) that ends with one of these will not get better
# by watching again (the group was deleted, the client's role revoked): the watch stops and
# the application's next read raises it (docs/client-protocol.md §3).
TERMINAL_WATCH_CODES = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)

# After a leader change, a binding without sidecars is the new leader still gathering its
# sidecars' re-joins: keep using the old ones this long rather than stop fetching.
EMPTY_BINDING_GRACE_SECONDS = 10.0


class BindingKeeper:
    """Which sidecars serve the client's group, kept current; and the calls to the assigner.

    :attr:`sidecars` (address → :class:`Sidecar`) is guarded by the lock the owner passes
    in, so the owner can read it together with state of its own. :attr:`changed` is set
    whenever a binding is applied (and when the watch fails for good); :attr:`closed` once
    :meth:`close` begins; :meth:`check` raises the watch's terminal error, if any."""

    def __init__(
        self,
        group: str,
        client_id: str,
        *,
        assigner: str,
        consul: str | None,
        leader_key: str,
        lock: threading.Lock,
        settings: ConnectionSettings = DEFAULT_SETTINGS,
    ) -> None:
        """Binds at once (retrying as :data:`CALLS` allows), then starts the watch thread
        and, given ``consul``, the leader watch. With ``consul`` the leader is read from
        ``leader_key`` first (raising what py-consul raises if it cannot be read)."""
        self.group = group
        self.client_id = client_id
        self._settings = settings
        # Sidecars get the sidecar-audience token (TlsConfig.sidecar_token_file).
        self._sidecar_settings = settings.with_tls(settings.tls.for_sidecars())
        self._assigner = LeaderFollower(AssignerTarget((assigner,), consul, leader_key), settings)
        self._lock = lock
        self.sidecars: dict[str, Sidecar] = {}
        self._binding_version = 0
        self.closed = threading.Event()
        self.changed = threading.Event()
        self._wake_watch = threading.Event()  # close() or a leader change
        self._watch_call: grpc.Call | None = None
        self._leader_changed_at: float | None = None
        self._failed: grpc.RpcError | None = None  # the status that stopped the watch
        try:
            if consul:
                self._assigner.locate()  # where to start: no "leader change" yet
            self._assigner.on_leader_change(self._on_leader)
            self._watched_assigner = self.assigner
            self._apply_binding(self._call_assigner(self._bind))
        except BaseException:
            self._assigner.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="ds-binding-watch", daemon=True)
        self._watcher.start()
        self._assigner.start()

    @property
    def assigner(self) -> str:
        """The address of the assigner followed now."""
        return self._assigner.address

    def close(self) -> None:
        """Unbind (best effort, 2 s), stop following and close every channel."""
        self.closed.set()
        self._wake_watch.set()
        request = binding_pb2.UnbindRequest(client_id=self.client_id, group=self.group)
        with contextlib.suppress(grpc.RpcError, ValueError):
            self._assigner.stub(Binding).Unbind(request, timeout=2)
        self._assigner.close()
        with self._lock:
            for sidecar in self.sidecars.values():
                sidecar.close()
            self.sidecars.clear()

    def check(self) -> None:
        """Raise :class:`ClientError` (``__cause__``: the assigner's status) if the watch
        stopped on a terminal status (:data:`TERMINAL_WATCH_CODES`); every read calls this,
        so the application sees what the background watch met."""
        failed = self._failed
        if failed is not None:
            raise ClientError(
                f"binding watch: {failed.code().name}: {failed.details()}"
            ) from failed

    # ---- binding ----------------------------------------------------------------------

    def _bind(self, stub: Binding) -> types_pb2.Binding:
        request = binding_pb2.BindRequest(client_id=self.client_id, group=self.group)
        return stub.Bind(request, timeout=10).binding

    def _watch(self) -> None:
        backoff = 0.1
        while not self.closed.is_set():
            try:
                if self.assigner != self._watched_assigner:
                    self._rebind()
                request = binding_pb2.WatchBindingRequest(
                    client_id=self.client_id, group=self.group, known_version=self._binding_version
                )
                call = self._assigner.stub(Binding).WatchBinding(request)
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
                status = err.__cause__ if isinstance(err, ClientError) else err
                if isinstance(status, grpc.RpcError) and status.code() in TERMINAL_WATCH_CODES:
                    log.warning("binding watch stopped: %s", status.code().name)
                    self._failed = status
                    self.changed.set()  # a fetch waiting for a binding wakes up to raise it
                    return
                if isinstance(err, grpc.RpcError):
                    self._assigner.follow(err)
                log.debug("binding watch broken; re-watching: %s", err)
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
                    self.sidecars.pop(address).close()
            for address, endpoint in wanted.items():
                sidecar = self.sidecars.get(address)
                if sidecar is None:
                    sidecar = self._open_sidecar(address, endpoint.local_address)
                    self.sidecars[address] = sidecar
                elif (endpoint.local_address and not sidecar.local) or (
                    sidecar.local_address != endpoint.local_address
                ):
                    # The socket may serve again (a restarted sidecar), or the binding
                    # names another one (or none): choose again.
                    sidecar.local_address = endpoint.local_address
                    target = self._target(address, endpoint.local_address)
                    if target != sidecar.target:
                        sidecar.attach(self._open(target), target)
                sidecar.partitions = {(tp.topic, tp.partition) for tp in endpoint.partitions}
        log.debug("binding version %d: %s", binding.version, sorted(wanted))
        self.changed.set()

    def _target(self, address: str, local_address: str) -> str:
        """The sidecar's socket when the client should dial it, else ``address``."""
        return sidecar_target(address, local_address, self._sidecar_settings.tls)

    def _open(self, target: str) -> grpc.Channel:
        return open_channel(target, self._sidecar_settings)

    def _open_sidecar(self, address: str, local_address: str) -> Sidecar:
        target = self._target(address, local_address)
        channel = self._open(target)
        return Sidecar(
            address,
            channel,
            stream_pb2_grpc.StreamServiceStub(channel),
            target=target,
            local_address=local_address,
            reopen=self._open,
        )

    def _on_leader(self, leader: str) -> None:
        """The follower switched to a new leader (a ``ds-leader`` answer, or the Consul
        watch): the watch thread re-binds there at once."""
        if self.closed.is_set():
            return
        log.info("following the assigner leader %s", leader)
        self._leader_changed_at = time.monotonic()
        call = self._watch_call
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]
        self._wake_watch.set()

    def _call_assigner(self, fn: Callable[[Binding], T]) -> T:
        """``fn`` on the leader as :data:`CALLS` allows. ``UNAVAILABLE`` to the end raises
        as it came; any other status (an election that did not end included) raises
        :class:`ClientError`."""
        try:
            return self._assigner.call(Binding, fn, CALLS)
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.UNAVAILABLE:
                raise
            raise ClientError(f"{err.code().name}: {err.details()}") from err
