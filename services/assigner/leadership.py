"""Which assigner replica leads: a Consul session lock, or always this one (ARCHITECTURE §2, §6).

With Consul, every replica campaigns for the KV key ``dataservice/assigner/leader``: it
creates a session and acquires the key with it, writing its advertised gRPC address as the
value. The holder leads; the others follow with a blocking query on the key and try to
acquire the moment it has no ``Session``.

Why the session is bound to the replica's own gRPC health check, with ``lock_delay=0``:
a kill -9 does not release a lock, and a session TTL cannot be shorter than 10 s (Consul
may even wait twice that). Consul already runs a gRPC health check on every registered
replica (interval 1 s, ``services/runtime/discovery.py``); a session that names the
check ``service:<service id>`` is invalidated as soon as that check goes critical, which
for a dead process (connection refused) takes about one check interval. Measured on Consul
1.14.11: the key loses its session 0.4 s after a kill -9 of the checked process. Consul's
default lock-delay (15 s) would then keep the key un-acquirable; 0 lets a standby take it
at once. The TTL (renewed every third of it) stays as a backstop for a replica that lives
but cannot reach Consul. A session cannot be created while its check is critical (a fresh
registration starts critical), so campaigning retries until the replica is SERVING.

A leader that learns the lock is no longer its own (the key changed holder, the session
was invalidated) stops acting as leader at once: ``is_leader`` turns False, the term's
``lost`` event is set (the leader guard ends open streams with it) and ``on_demoted`` runs.

A leader that cannot reach Consul for ``stale_after_seconds`` does not resign while its
term is confirmed by the state topic (``confirm_term``: a write under the state topic's
transactional id, which a newer leader's term fences; README "Fenced state writes"): a
Consul outage does not stop consumption. Nobody can be elected while Consul is down; a
replica elected behind a partition opens its term first, which fences this one's writes,
so this one stops at its next check (every ``term_check_seconds``) — before the new
leader grants anything (it waits TTL + grace after taking office). A check whose write
only times out (a slow broker) is retried for up to ``term_check_budget_seconds`` (TTL +
grace - ``term_check_seconds``: 3.5 s at the defaults) before the leader resigns: one slow
write does not end a term that nobody else can take while Consul is down.

After a Consul outage: Consul, back, may invalidate the leader's session (its TTL ran out
while nobody could renew it) and free the key. The leader that led through the outage
takes it back (a new session, then the acquire), but a standby keeps a session ready and
acquires in one write, so it used to win: a new leader, a restore, every lease lapsing
(chaos scenario 3 saw the restore take 4.2 s, past the 3 s TTL). So a standby that was
cut off from Consul itself (a call failed, or a blocking query came back more than
``consul_stall_seconds`` after its wait) leaves a free key alone for
``rejoin_defer_seconds`` after Consul answers again. A leader that really died meanwhile
costs that much more failover; a plain failover (the standby never lost Consul) is as fast
as before.

Without Consul, :class:`StaticLeadership` is the embedded default: a single assigner that
always leads.

One job, why whole (about 620 lines): which assigner replica leads, and when it must stop.
The Consul election, the static fallback and the term confirmation against the state topic
are one decision (lead or step down) whose timing rules depend on each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import consul
import structlog

from dsclient.addresses import parse_host_port
from dsclient.leader_watch import (
    DEFAULT_LEADER_KEY,
    consul_client,
    leader_of,
    next_index,
)
from dsclient.long_poll import long_poll

log = structlog.get_logger(__name__)

Callback = Callable[[], Awaitable[None]]


class Leadership(Protocol):
    """What the app and the leader guard need to know about leadership."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_address(self) -> str | None:
        """The current leader's gRPC address (this replica's when it leads), None if unknown."""

    def term_lost(self) -> asyncio.Event:
        """An event set when the current term of leadership ends (set while not leader)."""

    async def run(self) -> None: ...

    async def resign(self) -> None: ...

    async def fenced(self) -> None:
        """This replica's state writes were fenced by a newer leader's term (or cannot go
        on): stop leading at once."""


@dataclass(frozen=True)
class ElectionSettings:
    consul: str  # Consul agent HTTP HOST:PORT
    address: str  # this replica's advertised gRPC HOST:PORT, the key's value when it leads
    service_name: str = "ds-assigner"
    key: str = DEFAULT_LEADER_KEY
    session_ttl_seconds: int = 10  # Consul's minimum; only a backstop, see the module doc
    wait_seconds: int = 5  # longest blocking query
    retry_seconds: float = 0.25  # first retry after a failed Consul call (doubles, max 2 s)
    step_aside_seconds: float = 2.0  # pause after giving up a lock it could not lead with
    stale_after_seconds: float = 5.0  # a leader that cannot confirm its lock this long resigns
    # ... unless its state writes confirm its term (fenced writes): checked this often.
    term_check_seconds: float = 0.5
    # One check retries a term write that only timed out (a slow broker proves nothing)
    # for this long. With term_check_seconds at most lease TTL + grace (3 + 1 s by default),
    # so a leader cut off from Kafka too still resigns before a successor's first grant
    # (module doc); the assigner sets it from its lease settings (term_check_budget).
    term_check_budget_seconds: float = 3.5
    # A standby that could not reach Consul (a call failed, or a blocking query came back
    # this much later than its wait) leaves a key freed right after the outage to the
    # leader that led through it for this long (module doc: "After a Consul outage").
    rejoin_defer_seconds: float = 5.0
    consul_stall_seconds: float = 3.0
    # Checks to bind the session to; None = serfHealth + this replica's registered service
    # check, found in the local agent by service name and address.
    checks: tuple[str, ...] | None = None


def term_check_budget(
    lease_ttl_seconds: float, lease_grace_seconds: float, term_check_seconds: float
) -> float:
    """The longest one term check may retry a timed-out write: a leader cut off from Kafka
    (and Consul) must resign by the time a successor grants its first lease, TTL + grace
    after taking office; the check that notices starts up to ``term_check_seconds`` late.
    3.5 s at the defaults (TTL 3 s, grace 1 s, a check every 0.5 s). The assigner's TTL,
    not the shortest group's: a group with its own (shorter) TTL is kafka-fenced, where a
    cut-off leader's renewals extend no local deadline and its grants cannot be stored,
    so only lease-fenced groups, which keep the assigner's TTL, rest on this budget."""
    return max(lease_ttl_seconds + lease_grace_seconds - term_check_seconds, 0.0)


def service_check_id(services: Mapping[str, Mapping[str, Any]], name: str, address: str) -> str:
    """The check id (``service:<id>``) of the registered instance of ``name`` at ``address``,
    from ``/v1/agent/services``; LookupError while it is not registered."""
    host, port = parse_host_port(address)
    for service_id, svc in services.items():
        same_port = svc.get("Service") == name and int(svc.get("Port", -1)) == port
        if same_port and svc.get("Address") in (host, "", None):
            return f"service:{service_id}"
    raise LookupError(f"{name} at {address} is not registered in the local Consul agent yet")


class Unelected:
    """Before the election starts (the server is up before ``on_ready``): not leader, and
    no leader known."""

    @property
    def is_leader(self) -> bool:
        return False

    @property
    def leader_address(self) -> str | None:
        return None

    def term_lost(self) -> asyncio.Event:
        lost = asyncio.Event()
        lost.set()
        return lost

    async def run(self) -> None:
        return None

    async def resign(self) -> None:
        return None

    async def fenced(self) -> None:
        return None


class StaticLeadership:
    """No Consul: the only assigner, its address the leader's. It leads until its state
    writes are fenced — a second assigner without Consul started on the same state topic
    and took it — and then stops for good (restart it once the other one is stopped): two
    static leaders taking the topic from each other would each undo the other's work."""

    def __init__(
        self,
        address: str,
        *,
        on_elected: Callback | None = None,
        on_demoted: Callback | None = None,
    ) -> None:
        self._address = address
        self._on_elected = on_elected
        self._on_demoted = on_demoted
        self._lost = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        return not self._lost.is_set()

    @property
    def leader_address(self) -> str | None:
        return None if self._lost.is_set() else self._address

    def term_lost(self) -> asyncio.Event:
        return self._lost

    async def fenced(self) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        log.error(
            "lost leadership: another assigner took the state topic's transactional id; "
            "this one stops leading (run one assigner without Consul, or use Consul)",
            address=self._address,
        )
        if self._on_demoted is not None:
            await self._on_demoted()

    async def run(self) -> None:
        log.info("elected leader", address=self._address, election="static")
        if self._on_elected is not None:
            await self._on_elected()

    async def resign(self) -> None:
        return None


class LeaderElector:
    """Campaigns for the Consul lock until :meth:`resign` (see the module doc)."""

    def __init__(
        self,
        settings: ElectionSettings,
        *,
        on_elected: Callback | None = None,
        on_demoted: Callback | None = None,
        confirm_term: Callback | None = None,
        client: consul.Consul | None = None,
    ) -> None:
        self.settings = settings
        self.on_elected = on_elected
        self.on_demoted = on_demoted
        # A write that only the current term can make (the state topic's transactional
        # id): raises once a newer leader took the term. With it, a leader that cannot
        # reach Consul goes on leading while the write succeeds (module doc).
        self.confirm_term = confirm_term
        self._consul_reachable = True
        self.session_id: str | None = None
        self._is_leader = False
        self._leader_address: str | None = None
        self._lost = asyncio.Event()
        self._lost.set()
        self._confirmed_at = 0.0
        self._resigned = False
        # Consul outages this replica saw itself: since when (None: answering), and when
        # it answered again after one (the standby's deferral, module doc).
        self._consul_answered = False
        self._consul_lost_at: float | None = None
        self._consul_back_at: float | None = None
        self._client = client or consul_client(settings.consul)
        # Blocking queries hold a connection for up to wait_seconds: give them their own.
        self._watch_client = consul_client(settings.consul)
        self._log = log.bind(key=settings.key, address=settings.address)

    # ---- Leadership -------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    @property
    def leader_address(self) -> str | None:
        return self._leader_address

    def term_lost(self) -> asyncio.Event:
        return self._lost

    async def fenced(self) -> None:
        # The lock is someone else's by now (only the holder opens a term); should it
        # still be ours (the writer failed fatally), the campaign elects us again and a
        # new term opens.
        await self._demote("state writes fenced: a newer leader took the state topic")

    async def run(self) -> None:
        loops = [
            asyncio.create_task(self._renew_loop(), name="leader-session-renew"),
            asyncio.create_task(self._term_loop(), name="leader-term-check"),
        ]
        try:
            await self._campaign()
        finally:
            for task in loops:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def resign(self) -> None:
        """Graceful shutdown: stop leading, release the lock and destroy the session, so a
        standby acquires the key at once instead of waiting for a health check."""
        self._resigned = True
        await self._demote("resigned")
        session, self.session_id = self.session_id, None
        if session is None:
            return
        try:
            await asyncio.to_thread(
                self._client.kv.put, self.settings.key, self.settings.address, release=session
            )
            await asyncio.to_thread(self._client.session.destroy, session)
            self._log.info("leadership resigned; lock released")
        except Exception as exc:
            self._log.warning("could not release the leader lock", error=str(exc))

    # ---- campaign ---------------------------------------------------------------------

    async def _campaign(self) -> None:
        index: int | None = None
        backoff = self.settings.retry_seconds
        while not self._resigned:
            try:
                asked = time.monotonic()
                new_index, entry = await long_poll(
                    self._watch_client.kv.get,
                    self.settings.key,
                    index=index,
                    wait=f"{self.settings.wait_seconds}s",
                )
                self._consul_answer(asked)
                index = next_index(index, new_index)
                if await self._on_key(entry):
                    index = None  # we just tried to acquire: read the outcome at once
                backoff = self.settings.retry_seconds
            except Exception as exc:
                await self._on_consul_error(exc)
                index = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _consul_answer(self, asked: float) -> None:
        """A blocking query asked at ``asked`` was answered: note the end of an outage
        this replica saw (a failed call before, or this answer stalled past its wait)."""
        now = time.monotonic()
        stalled = now - asked > self.settings.wait_seconds + self.settings.consul_stall_seconds
        if self._consul_answered and (stalled or self._consul_lost_at is not None):
            self._consul_back_at = now
        self._consul_answered = True
        self._consul_lost_at = None

    def _deferring(self) -> float:
        """Seconds a standby still leaves a free key to the leader that led through the
        Consul outage it just saw (0: campaign)."""
        if self._consul_back_at is None:
            return 0.0
        return max(
            0.0, self._consul_back_at + self.settings.rejoin_defer_seconds - time.monotonic()
        )

    async def _on_key(self, entry: Mapping[str, Any] | None) -> bool:
        """React to the key's current state; True if an acquire was attempted."""
        holder = entry.get("Session") if entry else None
        if self._resigned:
            return False
        if holder and holder == self.session_id:
            self._confirmed(by="the leader key")
            await self._elected()
            return False
        if self._is_leader and (holder or not self._fenced_writes):
            await self._demote("the lock is no longer ours")
        if holder:
            self._follow(leader_of(entry))
            await self._prepare_session()
            return False
        if not self._is_leader and (wait := self._deferring()) > 0:
            self._follow(None)
            self._log.info(
                "leader lock free right after a Consul outage; leaving it to the leader that "
                "led through it",
                seconds=round(wait, 2),
            )
            await asyncio.sleep(wait)
            return True  # read the key again at once
        if self._is_leader:
            # Free, and we lead (our session was invalidated, e.g. by a Consul outage
            # longer than its TTL): take it back without stepping down. Leading on meanwhile
            # is safe for the same reason as leading through the outage: a replica that
            # takes the key first opens its term, which fences ours (the term check, the
            # next write), and it grants nothing for TTL + grace.
            self._log.info("leader lock free while leading; re-acquiring it")
        else:
            self._follow(None)
        if self.session_id is None:
            self.session_id = await self._create_session()
        await self._acquire()
        return True

    async def _prepare_session(self) -> None:
        """A follower keeps a session ready, so taking over costs one KV write. Failing is
        fine here (e.g. our check is not passing yet): it is retried on the next change
        of the key, and before any acquire."""
        if self.session_id is not None:
            return
        try:
            self.session_id = await self._create_session()
        except Exception as exc:
            self._log.debug("no leader session yet", error=str(exc))

    async def _acquire(self) -> None:
        assert self.session_id is not None
        acquired = await asyncio.to_thread(
            self._client.kv.put,
            self.settings.key,
            self.settings.address,
            acquire=self.session_id,
        )
        if not acquired:
            # Someone else won the race, or our session is gone: find out which.
            await self._check_session()

    async def _create_session(self) -> str:
        checks = list(self.settings.checks or ())
        if self.settings.checks is None:
            services = await asyncio.to_thread(self._client.agent.services)
            checks = [
                "serfHealth",
                service_check_id(services, self.settings.service_name, self.settings.address),
            ]
        session: str = await asyncio.to_thread(
            self._client.session.create,
            name=f"{self.settings.service_name} leader {self.settings.address}",
            checks=checks,
            lock_delay=0,
            behavior="release",
            ttl=self.settings.session_ttl_seconds,
        )
        self._log.info("leader session created", session=session, checks=checks)
        return session

    async def _check_session(self) -> None:
        session = self.session_id
        if session is None:
            return
        _, info = await asyncio.to_thread(self._client.session.info, session)
        if info is None:
            self._log.info("leader session invalidated; creating a new one", session=session)
            self.session_id = None
            if not self._fenced_writes:
                await self._demote("session invalidated")

    async def _renew_loop(self) -> None:
        period = max(1.0, self.settings.session_ttl_seconds / 3)
        while True:
            await asyncio.sleep(period)
            session = self.session_id
            if session is None:
                continue
            try:
                await asyncio.to_thread(self._client.session.renew, session)
                if self._is_leader:
                    self._confirmed(by="session renewal")
            except consul.NotFound:
                if self.session_id == session:
                    self._log.warning("leader session invalidated by Consul", session=session)
                    self.session_id = None
                    if not self._fenced_writes:
                        await self._demote("session invalidated")
                    # else: the campaign re-acquires the key (see _on_key)
            except Exception as exc:
                await self._on_consul_error(exc)

    async def _term_loop(self) -> None:
        """A leader whose lock Consul has not confirmed for ``stale_after_seconds`` (Consul
        unreachable) leads on only while a write that only its term can make succeeds,
        every ``term_check_seconds`` (a write that times out is retried within
        ``term_check_budget_seconds``); without ``confirm_term`` it resigns (as it always
        did). No second leader can act meanwhile: one cannot be elected while Consul is
        down, and one elected behind a partition fences this term first, so the next
        check fails and this replica stops within one check."""
        while True:
            await asyncio.sleep(self.settings.term_check_seconds)
            stale = time.monotonic() - self._confirmed_at > self.settings.stale_after_seconds
            if not (self._is_leader and stale):
                continue
            if self.confirm_term is None:
                await self._demote("cannot confirm the lock with Consul")
                continue
            try:
                await self._confirm_term_within(self.settings.term_check_budget_seconds)
            except Exception as exc:
                await self._demote(f"Consul unreachable and the term not confirmed: {exc!r}")
                continue
            if self._consul_reachable:
                self._consul_reachable = False
                self._log.warning(
                    "Consul unreachable: leading on, the state topic confirms the term"
                )

    async def _confirm_term_within(self, budget: float) -> None:
        """``confirm_term``, retried while it only times out, until it succeeds or
        ``budget`` seconds have passed (then the last ``TimeoutError`` is raised). A write
        that timed out proves neither that the term goes on nor that it ended (a slow
        broker: chaos scenario 3 lost its only electable leader to one such write); a
        refusal (``Fenced``: a newer term; any other error) is final at once."""
        assert self.confirm_term is not None
        deadline = time.monotonic() + budget
        while True:
            left = deadline - time.monotonic()
            try:
                await asyncio.wait_for(self.confirm_term(), max(left, 0.001))
                return
            except TimeoutError as exc:
                if time.monotonic() >= deadline:
                    raise
                self._log.warning("term check write slow; retrying it", error=str(exc))
                # A pause between attempts: a write that fails at once must not spin.
                await asyncio.sleep(
                    min(self.settings.term_check_seconds, max(deadline - time.monotonic(), 0))
                )

    async def _on_consul_error(self, exc: Exception) -> None:
        if isinstance(exc, LookupError) or "critical state" in str(exc):
            # Not registered yet / our check is not passing yet: normal during start-up.
            self._log.debug("cannot campaign yet", error=str(exc))
        else:
            if self._consul_answered and self._consul_lost_at is None:
                self._consul_lost_at = time.monotonic()
            self._log.warning("leader election: Consul call failed; retrying", error=str(exc))
        if "invalid session" in str(exc).lower():
            self.session_id = None

    @property
    def _fenced_writes(self) -> bool:
        """The term is fenced by the state topic (``confirm_term``): losing the Consul
        session is not losing leadership until another replica holds the key."""
        return self.confirm_term is not None

    def _confirmed(self, *, by: str) -> None:
        self._confirmed_at = time.monotonic()
        if not self._consul_reachable:
            self._consul_reachable = True
            self._log.info("Consul reachable again: the lock confirmed", by=by)

    # ---- transitions ------------------------------------------------------------------

    async def _elected(self) -> None:
        if self._is_leader:
            return
        self._is_leader = True
        self._leader_address = self.settings.address
        self._lost = asyncio.Event()
        self._log.info("elected leader", session=self.session_id)
        if not await self._call(self.on_elected, "on_elected"):
            await self._step_aside()

    async def _step_aside(self) -> None:
        """Give the lock up after ``on_elected`` failed (e.g. the state topic did not serve
        in time while the brokers were still starting): a replica that holds the lock but
        never took office would leave the mesh without a working leader until it restarts.
        Demote, release the key (the session stays) and pause before campaigning again, so a
        standby can take the lock, or this replica retries taking office."""
        await self._demote("could not take office")
        if self.session_id is not None:
            try:
                await asyncio.to_thread(
                    self._client.kv.put,
                    self.settings.key,
                    self.settings.address,
                    release=self.session_id,
                )
            except Exception as exc:
                self._log.warning("could not release the leader lock", error=str(exc))
        await asyncio.sleep(self.settings.step_aside_seconds)

    async def _demote(self, why: str) -> None:
        if not self._is_leader:
            return
        self._is_leader = False
        self._leader_address = None
        self._lost.set()
        self._log.warning("lost leadership", why=why)
        await self._call(self.on_demoted, "on_demoted")

    def _follow(self, leader: str | None) -> None:
        if leader == self._leader_address:
            return
        self._leader_address = leader
        if leader is None:
            self._log.info("no leader; campaigning")
        else:
            self._log.info("following leader", leader=leader)

    async def _call(self, callback: Callback | None, what: str) -> bool:
        """Run a leadership callback; False (logged) if it raised."""
        if callback is None:
            return True
        try:
            await callback()
        except Exception:
            self._log.exception("leadership callback failed", callback=what)
            return False
        return True


class Replica:
    """This replica as its servicers, leader guard and pages see it: its advertised gRPC
    address and its current :class:`Leadership`.

    Both are only known in ``on_ready`` (the bound port; the election starts there), after
    everything that reads them was built, so those hold this object and read it per call.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.leadership: Leadership = Unelected()

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    @property
    def leader_address(self) -> str | None:
        return self.leadership.leader_address
