"""Follow a leader key in Consul KV with blocking queries (ARCHITECTURE §3 "Leaders").

The assigner leader holds ``<prefix>/leader`` with a Consul session lock; the value is its
advertised gRPC address. A key without a ``Session`` has no leader (the holder died or
resigned), whatever its value still says. Watchers learn about a change the moment Consul
applies it — a blocking query returns as soon as the key's index moves — never after a
cache expires. Two flavours: :class:`LeaderWatch` for asyncio services (the sidecar) and
:class:`LeaderWatchThread` for the synchronous client library.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from services.runtime.addresses import parse_host_port
from services.runtime.long_poll import long_poll

if TYPE_CHECKING:
    import consul

log = structlog.get_logger(__name__)

DEFAULT_LEADER_KEY = "dataservice/assigner/leader"
# How long one blocking query may wait; short enough that stop() is prompt.
WAIT_SECONDS = 5


def leader_of(entry: Mapping[str, Any] | None) -> str | None:
    """The leader address a KV entry names: its value while a session holds it, else None."""
    if not entry or not entry.get("Session"):
        return None
    value = entry.get("Value")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    address = str(value).strip() if value else ""
    return address or None


def next_index(previous: int | None, returned: Any) -> int | None:
    """The index for the next blocking query. Consul's rule: if the index went backwards
    (a snapshot restore, a new cluster) start again from 0, and never pass 0 as a wait."""
    try:
        index = int(returned)
    except (TypeError, ValueError):
        return None
    if index <= 0 or (previous is not None and index < previous):
        return None
    return index


def consul_client(address: str) -> consul.Consul:
    # py-consul (and requests under it, ~6 MiB) only in a process that talks to Consul:
    # DsClient and the sidecar import this module for DEFAULT_LEADER_KEY (issue 34).
    import consul

    host, port = parse_host_port(address, what="consul address")
    return consul.Consul(host=host, port=port, connections_timeout=5)


def read_leader(client: consul.Consul, key: str = DEFAULT_LEADER_KEY) -> str | None:
    """One non-blocking read of the current leader (None while there is none)."""
    _, entry = client.kv.get(key)
    return leader_of(entry)


LeaderCallback = Callable[[str | None], Awaitable[None]]


class LeaderWatch:
    """Calls ``on_change(address or None)`` whenever the leader named by ``key`` changes
    (and once at start, with the current one). Runs until cancelled."""

    def __init__(self, consul_address: str, key: str, on_change: LeaderCallback) -> None:
        self.key = key
        self.leader: str | None = None
        self._client = consul_client(consul_address)
        self._on_change = on_change
        self._address = consul_address

    async def run(self) -> None:
        index: int | None = None
        first = True
        backoff = 0.2
        while True:
            try:
                new_index, entry = await long_poll(
                    self._client.kv.get, self.key, index=index, wait=f"{WAIT_SECONDS}s"
                )
            except Exception as exc:
                log.warning("leader watch failed; retrying", consul=self._address, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                index = None
                continue
            backoff = 0.2
            index = next_index(index, new_index)
            leader = leader_of(entry)
            if first or leader != self.leader:
                first = False
                self.leader = leader
                try:
                    await self._on_change(leader)
                except Exception:
                    log.exception("leader change callback failed", leader=leader)


async def watch_leader(consul_address: str, key: str, on_change: LeaderCallback) -> None:
    """Follow ``key`` until cancelled (see :class:`LeaderWatch`)."""
    await LeaderWatch(consul_address, key, on_change).run()


class LeaderWatchThread:
    """The synchronous twin of :class:`LeaderWatch` on a daemon thread, for the client
    library. ``on_change`` runs on the watch thread; keep it short."""

    def __init__(
        self,
        consul_address: str,
        on_change: Callable[[str | None], None],
        key: str = DEFAULT_LEADER_KEY,
    ) -> None:
        self.key = key
        self.leader: str | None = None
        self._client = consul_client(consul_address)
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-leader-watch", daemon=True)

    def current(self) -> str | None:
        """Read the leader now (no blocking query); also the watch's starting point."""
        self.leader = read_leader(self._client, self.key)
        return self.leader

    def start(self) -> LeaderWatchThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        # The thread may sit in a blocking query for up to WAIT_SECONDS: it is a daemon,
        # and it checks the flag before calling back, so there is no need to join it.
        self._stop.set()

    def _run(self) -> None:
        index: int | None = None
        backoff = 0.2
        while not self._stop.is_set():
            try:
                new_index, entry = self._client.kv.get(
                    self.key, index=index, wait=f"{WAIT_SECONDS}s"
                )
            except Exception as exc:
                log.debug("leader watch failed; retrying", error=str(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                index = None
                continue
            backoff = 0.2
            index = next_index(index, new_index)
            leader = leader_of(entry)
            if leader != self.leader and not self._stop.is_set():
                self.leader = leader
                with contextlib.suppress(Exception):
                    self._on_change(leader)
