"""Following the assigner's leader: the current address and its channel, and calls that
land on the leader however leadership moves (ARCHITECTURE §3 "Leaders").

:class:`LeaderFollower` is the flavour for threads; ``aio_follower.AioLeaderFollower`` the
one for asyncio. Both keep one channel to the address they follow and run a call as
:mod:`~dsclient.connection.policy` decides: a leader named in ``ds-leader`` is
followed at once; an election in progress and ``UNAVAILABLE`` (after gRPC's own retries)
are retried with jittered backoff within the caller's budget, the Consul leader key (or the
next replica address) consulted between attempts; any other status reaches the caller
unchanged. Long-lived streams (the sidecar's Session, the client's WatchBinding) keep their
own loops: they take a :meth:`stub`, hand a failure to :meth:`follow`, and hear of a new
leader through :meth:`on_leader_change`.

Stubs come from the follower, never from a channel in the caller's hands: they are made
under the lock, once per channel, because grpcio crashes the process when a stub is made
on a closed channel (1.85: a segmentation fault; calling an existing one raises). A switch
replaces the channel under the lock, tells the listeners, then closes the old channel: a
call that was on it fails (``ValueError`` "closed channel", ``UsageError``, or
``CANCELLED``) and is tried again at once on the new one.
"""

from __future__ import annotations

import abc
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc
import grpc.aio

from dsclient.connection.channels import open_channel
from dsclient.connection.policy import Action, Attempts, CallPolicy, Failure, decide
from dsclient.connection.settings import DEFAULT_SETTINGS, ConnectionSettings
from dsclient.connection.targets import AssignerTarget, LeaderUnknown, Stoppable

# Standard logging rather than structlog: Spark workers import this (see settings.py).
log = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S")
C = TypeVar("C", grpc.Channel, grpc.aio.Channel)
RetryHook = Callable[[grpc.RpcError], None]


@dataclass(frozen=True)
class Step:
    """What follows a failed attempt: switch to ``leader`` first (if named), then wait
    ``pause`` seconds and look the leader up again (if positive), then call again."""

    leader: str | None
    pause: float


def _closed_under(err: Exception) -> bool:
    """The failure of a call whose channel was closed while it ran or was about to."""
    if isinstance(err, ValueError | grpc.aio.UsageError):
        return True
    return isinstance(err, grpc.RpcError) and err.code() is grpc.StatusCode.CANCELLED


class Following(abc.ABC, Generic[C]):
    """What both flavours share: the address followed, its channel, the listeners, and
    the decision after a failed attempt."""

    def __init__(self, target: AssignerTarget, settings: ConnectionSettings) -> None:
        self.target = target
        self.settings = settings
        self._lock = threading.Lock()
        self._address = target.first
        self._channel: C | None = None
        self._stubs: dict[Callable[[C], Any], Any] = {}
        self._generation = 0  # how many times the channel was replaced
        self._closed = False
        self._listeners: list[Callable[[str], None]] = []

    @property
    def address(self) -> str:
        """The assigner called now: the leader as last learnt ("" while only Consul can
        name it and has not yet)."""
        return self._address

    def on_leader_change(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(address)`` after every switch to a new address, on the thread
        (or in the loop) that learnt of it, before the old channel is closed."""
        self._listeners.append(listener)

    def stub(self, kind: Callable[[C], S]) -> S:
        """A ``kind`` stub (e.g. ``AdminServiceStub``) on the channel to :attr:`address`,
        opened on first use. Raises ``ValueError`` once closed, :class:`LeaderUnknown`
        while there is no address to call."""
        return self._stub(kind)[0]

    def _stub(self, kind: Callable[[C], S]) -> tuple[S, int]:
        """The stub, and the generation of the channel it is on."""
        with self._lock:
            if self._closed:
                raise ValueError("the assigner connection is closed")
            if not self._address:
                raise LeaderUnknown("the assigner leader is unknown (no leader key in Consul)")
            if self._channel is None:
                self._channel = self._open(self._address)
            if kind not in self._stubs:
                self._stubs[kind] = kind(self._channel)
            return cast(S, self._stubs[kind]), self._generation

    @abc.abstractmethod
    def _open(self, address: str) -> C: ...

    def _replace(self, address: str) -> C | None:
        """Make ``address`` current and tell the listeners. Returns the old channel for
        the caller to close; None if nothing changed (or no channel was open)."""
        with self._lock:
            if self._closed or not address or address == self._address:
                return None
            old, self._channel = self._channel, None
            self._stubs.clear()
            self._generation += 1
            self._address = address
        for listener in list(self._listeners):
            try:
                listener(address)
            except Exception:
                log.exception("leader change listener failed")
        return old

    def _take_channel(self) -> C | None:
        """Close the follower: no channel is opened from now on. Returns the last one."""
        with self._lock:
            self._closed = True
            channel, self._channel = self._channel, None
            self._stubs.clear()
        return channel

    def _looked_up(self) -> str:
        """Where to call after a backoff: the leader the Consul key names, else the next
        replica address, else the same one."""
        try:
            leader = self.target.read_leader()
        except Exception as exc:  # Consul down: keep to the addresses we have
            log.info("consul %s: leader lookup failed: %s", self.target.consul, exc)
            leader = None
        return leader or self.target.after(self._address) or self._address

    def _step(
        self, err: Exception, generation: int, attempts: Attempts, on_retry: RetryHook | None
    ) -> Step:
        """After an attempt on the ``generation``-th channel failed with ``err``: what to
        do next. Re-raises ``err`` when the call gives up."""
        leader = None
        if generation != self._generation and not self._closed and _closed_under(err):
            action = Action.FOLLOW  # switched under the call: again, on the new channel
        elif isinstance(err, grpc.RpcError):
            failure = Failure.of(err)
            action = decide(failure, self._address, attempts.policy)
            leader = failure.leader
        else:
            raise err
        pause = attempts.pause(action, time.monotonic(), random.random())
        if pause is None:
            raise err
        if action is Action.RETRY and on_retry is not None and isinstance(err, grpc.RpcError):
            on_retry(err)
        return Step(leader if action is Action.FOLLOW else None, pause)


class LeaderFollower(Following[grpc.Channel]):
    """Follows the assigner's leader for threads; every method is thread-safe.

    :meth:`start` follows the Consul leader key on a daemon thread (given Consul);
    :meth:`close` stops that and closes the channel."""

    def __init__(
        self, target: AssignerTarget, settings: ConnectionSettings = DEFAULT_SETTINGS
    ) -> None:
        super().__init__(target, settings)
        self._watch: Stoppable | None = None

    def _open(self, address: str) -> grpc.Channel:
        return open_channel(address, self.settings)

    def call(
        self,
        kind: Callable[[grpc.Channel], S],
        fn: Callable[[S], T],
        policy: CallPolicy,
        *,
        on_retry: RetryHook | None = None,
    ) -> T:
        """``fn(stub)`` with a ``kind`` stub on the leader, as ``policy`` allows (see the
        module docstring); ``on_retry(error)`` before each backoff. Raises the last
        ``grpc.RpcError`` unchanged when the call gives up, :class:`LeaderUnknown` when
        there is no address to call, ``ValueError`` once closed."""
        attempts = Attempts(policy, time.monotonic())
        while True:
            stub, generation = self._stub(kind)
            try:
                return fn(stub)
            except (grpc.RpcError, ValueError) as err:
                step = self._step(err, generation, attempts, on_retry)
            if step.leader:
                self.switch(step.leader)
            elif step.pause:
                time.sleep(step.pause)
                self.refresh()

    def switch(self, address: str) -> None:
        """Call ``address`` from now on (no-op if it is the current one)."""
        old = self._replace(address)
        if old is not None:
            old.close()

    def follow(self, err: grpc.RpcError) -> bool:
        """Switch to the leader ``err`` names in ``ds-leader``; True if that is a new one."""
        leader = Failure.of(err).leader
        if not leader or leader == self._address:
            return False
        self.switch(leader)
        return True

    def refresh(self) -> None:
        """Look the leader up again: the Consul key, else the next replica address."""
        self.switch(self._looked_up())

    def locate(self) -> None:
        """Read the Consul leader key now and switch to the leader it names (if any).
        Raises what py-consul raises when the agent cannot be read."""
        if leader := self.target.read_leader():
            self.switch(leader)

    def start(self) -> LeaderFollower:
        """Follow the Consul leader key with blocking queries (nothing without Consul)."""
        self._watch = self.target.watch_thread(self._on_watched)
        return self

    def _on_watched(self, leader: str | None) -> None:
        if leader:
            self.switch(leader)

    def close(self) -> None:
        """Stop following and close the channel; calls from now on raise ``ValueError``."""
        if self._watch is not None:
            self._watch.stop()
        channel = self._take_channel()
        if channel is not None:
            channel.close()


def retry_call(fn: Callable[[], T], policy: CallPolicy) -> T:
    """``fn()``, a call to a peer that is not followed (a sidecar), retried as ``policy``
    says; the last ``grpc.RpcError`` raised unchanged."""
    attempts = Attempts(policy, time.monotonic())
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            action = decide(Failure.of(err), "", policy)
            pause = attempts.pause(action, time.monotonic(), random.random())
            if pause is None:
                raise
        time.sleep(pause)
