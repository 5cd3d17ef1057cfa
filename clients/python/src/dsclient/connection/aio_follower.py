"""Following the assigner's leader in asyncio services (the sidecar): the twin of
:class:`~dsclient.connection.follower.LeaderFollower`, with the same rules (see
that module); use it from the event loop that created it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import grpc.aio

from dsclient.connection.channels import open_aio_channel
from dsclient.connection.follower import Following, RetryHook
from dsclient.connection.policy import Attempts, CallPolicy, Failure
from dsclient.connection.settings import DEFAULT_SETTINGS, ConnectionSettings
from dsclient.connection.targets import AssignerTarget

T = TypeVar("T")
S = TypeVar("S")


class AioLeaderFollower(Following[grpc.aio.Channel]):
    """Follows the assigner's leader for asyncio code. The channel is opened on first use
    (in the running loop); :meth:`start` follows the Consul leader key in a task (given
    Consul); :meth:`close` cancels that and closes the channel."""

    def __init__(
        self, target: AssignerTarget, settings: ConnectionSettings = DEFAULT_SETTINGS
    ) -> None:
        super().__init__(target, settings)
        self._watch: asyncio.Task[None] | None = None

    def _open(self, address: str) -> grpc.aio.Channel:
        return open_aio_channel(address, self.settings)

    async def call(
        self,
        kind: Callable[[grpc.aio.Channel], S],
        fn: Callable[[S], Awaitable[T]],
        policy: CallPolicy,
        *,
        on_retry: RetryHook | None = None,
    ) -> T:
        """``await fn(stub)`` with a ``kind`` stub on the leader, as ``policy`` allows;
        raises as :meth:`LeaderFollower.call
        <dsclient.connection.follower.LeaderFollower.call>` does."""
        attempts = Attempts(policy, time.monotonic())
        while True:
            stub, generation = self._stub(kind)
            try:
                return await fn(stub)
            except (grpc.RpcError, ValueError, grpc.aio.UsageError) as err:
                step = self._step(err, generation, attempts, on_retry)
            if step.leader:
                await self.switch(step.leader)
            elif step.pause:
                await asyncio.sleep(step.pause)
                await self.refresh()

    async def switch(self, address: str) -> None:
        """Call ``address`` from now on (no-op if it is the current one)."""
        old = self._replace(address)
        if old is not None:
            await old.close(None)

    async def follow(self, err: grpc.RpcError) -> bool:
        """Switch to the leader ``err`` names in ``ds-leader``; True if that is a new one."""
        leader = Failure.of(err).leader
        if not leader or leader == self._address:
            return False
        await self.switch(leader)
        return True

    async def refresh(self) -> None:
        """Look the leader up again: the Consul key, else the next replica address."""
        await self.switch(await asyncio.to_thread(self._looked_up))

    def start(self) -> None:
        """Follow the Consul leader key with blocking queries (nothing without Consul)."""
        self._watch = self.target.watch_task(self._on_watched)

    async def _on_watched(self, leader: str | None) -> None:
        if leader:
            await self.switch(leader)

    async def close(self) -> None:
        """Stop following and close the channel; calls from now on raise ``ValueError``."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        channel = self._take_channel()
        if channel is not None:
            await channel.close(None)
