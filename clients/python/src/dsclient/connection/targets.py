"""Where the assigner is: replica addresses, the Consul leader key, or both.

A target names every way the caller knows to find the leader. The follower starts at the
first address; after a failed attempt it tries the next replica (Spark's ``assigner``
option may list several) and reads the leader key again, which, when Consul is given,
names the leader directly (ARCHITECTURE §3: the leader holds the key with a session lock).

:mod:`dsclient.leader_watch` (py-consul) is imported only when
Consul is used: Spark workers without Consul never pay for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


class LeaderUnknown(LookupError):
    """No address to call: no replica address was given and Consul names no leader."""


class Stoppable(Protocol):
    def stop(self) -> None: ...


@dataclass(frozen=True)
class AssignerTarget:
    """The assigner's replica addresses (``HOST:PORT``, any of them may be the leader) and
    the Consul agent whose leader key names the leader."""

    addresses: tuple[str, ...] = ()
    consul: str | None = None
    leader_key: str | None = None  # None: leader_watch.DEFAULT_LEADER_KEY

    def __post_init__(self) -> None:
        if not self.addresses and not self.consul:
            raise LeaderUnknown("no assigner address and no Consul to find one")

    @property
    def first(self) -> str:
        """Where to start before anything is known ("" with Consul alone)."""
        return self.addresses[0] if self.addresses else ""

    def after(self, address: str) -> str | None:
        """The replica to try after ``address`` failed, if there is another one."""
        if len(self.addresses) < 2:
            return None
        index = self.addresses.index(address) if address in self.addresses else -1
        return self.addresses[(index + 1) % len(self.addresses)]

    @property
    def key(self) -> str:
        from dsclient.leader_watch import DEFAULT_LEADER_KEY

        return self.leader_key or DEFAULT_LEADER_KEY

    def read_leader(self) -> str | None:
        """The leader the Consul key names now (None without Consul or without a leader).
        Raises what py-consul raises when the agent cannot be read."""
        if not self.consul:
            return None
        from dsclient.leader_watch import consul_client, read_leader

        return read_leader(consul_client(self.consul), self.key)

    def watch_thread(self, on_change: Callable[[str | None], None]) -> Stoppable | None:
        """Follow the leader key on a daemon thread (blocking queries); None without Consul."""
        if not self.consul:
            return None
        from dsclient.leader_watch import LeaderWatchThread

        return LeaderWatchThread(self.consul, on_change, key=self.key).start()

    def watch_task(
        self, on_change: Callable[[str | None], Awaitable[None]]
    ) -> asyncio.Task[None] | None:
        """Follow the leader key in a task of the running loop; None without Consul."""
        if not self.consul:
            return None
        from dsclient.leader_watch import LeaderWatch

        watch = LeaderWatch(self.consul, self.key, on_change)
        return asyncio.create_task(watch.run(), name="assigner-leader-watch")
