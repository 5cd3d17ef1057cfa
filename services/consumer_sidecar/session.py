"""The sidecar side of ``AssignerService.Session`` (ARCHITECTURE §3.1).

Join (with the leases still held, so a re-attach moves nothing) → heartbeats every
interval carrying progress and released leases → apply grants and revokes as they come.
Deadlines without synchronized clocks: the monotonic time each heartbeat is *sent* is kept;
when its ack arrives, every lease it renews gets deadline = send time + TTL - margin.
A broken stream is not a lost lease: leases keep serving until their deadline while the
session reconnects with jittered backoff, following ``ds-leader`` to the leader.

The assigner's address, its channel and the leader following are the session's
:class:`~dsclient.connection.AioLeaderFollower`'s. With Consul configured it also
follows the assigner's leader key with blocking queries: when another replica takes the
lock, the open stream (to a dead or demoted leader) is ended and the sidecar re-joins the
new leader at once, reporting the leases it holds — no backoff, no waiting for a TCP
timeout.

The group's consumer config comes with ``SessionAccepted`` and every ``ConfigUpdate``: each
is handed to :attr:`SessionEvents.on_config` (the sidecar's ``live_config.py`` applies it),
and every heartbeat reports the version that runs and the last refusal
(the ``config_status`` it is given), in either mode.

The group's mode comes with ``SessionAccepted.mode``. In ``kafka_group`` mode (ARCHITECTURE
§5.6) Kafka assigns the partitions (:mod:`services.consumer_sidecar.kafka_group_membership`) and the
session only carries membership (the assigner binds clients to the group's live sidecars)
and config. Should the assigner still send lease grants for such a group, they are held
*nominally*: acknowledged and renewed by heartbeats so the assigner's view stays stable,
released at once when revoked, and never fetched — they must not touch Kafka partitions.
A mode switch (``UpdateGroup``) ends the session: the sidecar re-joins, and a
``SessionAccepted`` with another mode switches it at runtime (``on_accepted`` does the
consumer's part, :mod:`services.consumer_sidecar.kafka_group_mode`).

One job, why whole (about 630 lines): the sidecar's Session stream with the assigner: join,
heartbeats, grants, revokes and leave, with its reconnect and leader-following loop. The
stream's state (session id, nominal leases, pending grants) is read by every message
handler; the lease work itself is leasing.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import structlog

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.connection import (
    DEFAULT_SETTINGS,
    AioLeaderFollower,
    AssignerTarget,
    Backoff,
    ConnectionSettings,
    pause_before_retry,
)
from dsclient.leader_watch import DEFAULT_LEADER_KEY
from dsclient.reasons import Reason, error_info, retry_after
from services.consumer_sidecar.client_access import ClientTotals
from services.consumer_sidecar.events import SessionEvents
from services.consumer_sidecar.leasing import LeaseKeeper, ReleasedLease
from services.consumer_sidecar.partitions import UNLEASED_EPOCH
from services.consumer_sidecar.round_timing import RoundTimer
from services.consumer_sidecar.stall_watch import stall_limit_for
from services.runtime.group_enums import COMMIT_FENCINGS, EXTERNAL_OFFSET_CHANGES, ORDERINGS
from services.runtime.tasks import TaskSet
from services.runtime.topic_partition import TP

log = structlog.get_logger(__name__)

MAX_RECONNECT_BACKOFF = 1.0  # seconds
# Reconnects back off from 0.1 s, capped at 1 s: a restarted assigner waits TTL + grace for
# sidecars to re-attach with their leases before it grants anything (no moves). A throttled
# join (JOIN_THROTTLED) waits at least the assigner's retry-after, jittered (issue 36).
RECONNECT_BACKOFF = Backoff(initial=0.1, maximum=MAX_RECONNECT_BACKOFF)
# The leader moved (a redirect): reconnect almost at once.
REDIRECTED_BACKOFF = Backoff(initial=0.05, maximum=0.05)


# What a heartbeat reports of the group's consumer config: the version that runs, and the
# newest refused version with its reason (None: none).
ConfigStatus = tuple[int, tuple[int, str] | None]


def delivery_margin_for(
    setting: float, ttl: float, safety_margin: float, heartbeat_interval: float
) -> float:
    """The delivery margin a group's lease timing allows: at most half of what a lease
    renewed on time has left just before its next renewal (TTL less the safety margin
    less a heartbeat interval), so a lease renewed on time never stops delivering; only
    one whose renewals stopped (the assigner away) stops a margin before its deadline."""
    return max(0.0, min(setting, (ttl - safety_margin - heartbeat_interval) / 2))


@dataclass(frozen=True)
class SessionIdentity:
    sidecar_id: str
    group: str
    endpoint: str
    zone: str = ""
    capacity: int = 0
    local_endpoint: str = ""  # unix:PATH for the application in the pod; "" = TCP only


class SessionClient:
    def __init__(
        self,
        identity: SessionIdentity,
        assigner: str,
        keeper: LeaseKeeper,
        *,
        safety_margin: float,
        delivery_margin: float = 0.0,
        consul: str | None = None,
        leader_key: str = DEFAULT_LEADER_KEY,
        settings: ConnectionSettings = DEFAULT_SETTINGS,
        events: SessionEvents | None = None,
        config_status: Callable[[], ConfigStatus] = lambda: (0, None),
        client_activity: Callable[[], Sequence[ClientTotals]] = list,
    ) -> None:
        """``events``: what the session reports (the group's settings, its joins and
        heartbeats); ``config_status``: what runs of the group's consumer config (applied
        version, the last refusal as (version, reason) or None); ``client_activity``: the
        application clients' totals (client-access metrics), sent in every heartbeat."""
        self.identity = identity
        self._events = events or SessionEvents()
        # The assigner leader's address and channel; also the app's for its own calls.
        self.follower = AioLeaderFollower(AssignerTarget((assigner,), consul, leader_key), settings)
        self.follower.on_leader_change(self._on_leader)
        self.keeper = keeper
        self.margin = safety_margin
        self.delivery_margin = delivery_margin  # the setting; capped per group (below)
        self.connected = False
        self.ttl = 3.0
        self.heartbeat_interval = 1.0
        self.session_id = ""
        self._heard_at = 0.0  # when the current stream last brought a message
        # seq -> (monotonic send time, the leases it named), until its ack arrives.
        self._sent_at: dict[int, tuple[float, set[tuple[TP, int]]]] = {}
        self._seq = 0
        # None ends a session's request stream.
        self._outbox: asyncio.Queue[assigner_pb2.SessionRequest | None] = asyncio.Queue()
        self._heartbeat_now = asyncio.Event()
        self._tasks = TaskSet("lease operation failed")
        self._stopping = False
        self._grants: dict[TP, int] = {}
        self._current: asyncio.Task[None] | None = None
        self._redirected = asyncio.Event()
        keeper.on_release = self._heartbeat_now.set
        # The group's mode, from the latest SessionAccepted (a mode switch re-joins).
        self.mode: common_pb2.GroupMode.ValueType = common_pb2.GROUP_MODE_UNSPECIFIED
        self.config_status = config_status
        self.client_activity = client_activity
        self._config_version = -1
        self._nominal: dict[TP, int] = {}  # kafka_group mode: leases held only on paper
        self._round = RoundTimer(time.monotonic)
        self._nominal_released: list[ReleasedLease] = []

    @property
    def kafka_group(self) -> bool:
        return self.mode == common_pb2.GROUP_MODE_KAFKA_GROUP

    @property
    def assigner(self) -> str:
        """The address of the assigner followed now."""
        return self.follower.address

    async def run(self) -> None:
        """Keep a session open until cancelled; reconnect on any failure. Follows the
        Consul leader key meanwhile (given Consul); closes the follower at the end."""
        self.follower.start()
        try:
            await self._session_loop()
        finally:
            await self.follower.close()

    def _on_leader(self, leader: str) -> None:
        """The follower switched to a new leader (a ``ds-leader`` answer, or Consul names
        it): move there now, ending a stream to the old one."""
        log.info("assigner leader changed; moving the session", leader=leader)
        self._redirected.set()
        if self._current is not None and not self._current.done():
            self._current.cancel()

    async def _session_loop(self) -> None:
        retries, redirected, asked = 0, False, None
        while not self._stopping:
            self._redirected.clear()
            self._current = asyncio.create_task(self._one_session(), name="assigner-session")
            try:
                # wait() rather than await: cancelling run() must not look like a redirect,
                # and a redirect (the task cancelled) must not cancel run().
                await asyncio.wait({self._current})
            except asyncio.CancelledError:
                self._current.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._current
                raise
            try:
                self._current.result()
                retries = 0
                self._session_ended(failed=True)
            except asyncio.CancelledError:
                redirected = True  # by the leader watch: reconnect at once
                self._session_ended(failed=False)
            except grpc.aio.AioRpcError as err:
                if await self.follower.follow(err) or self._redirected.is_set():
                    redirected = True  # the stream broke because the leader moved
                    self._session_ended(failed=False)
                else:
                    self._session_ended(failed=True)
                    asked = retry_after(err)  # a throttled join (JOIN_THROTTLED)
                    info = error_info(err)
                    log.warning(
                        "assigner session failed; reconnecting",
                        code=err.code().name,
                        reason=info.reason if info else None,
                        error=err.details(),
                        assigner=self.assigner,
                    )
            except Exception:
                log.exception("assigner session crashed; reconnecting")
                self._session_ended(failed=True)
            self.connected = False
            if self._stopping:
                break
            schedule = REDIRECTED_BACKOFF if redirected else RECONNECT_BACKOFF
            pause = pause_before_retry(schedule, retries, random.random(), asked)
            retries = 0 if redirected else retries + 1
            redirected, asked = False, None
            if self._redirected.is_set():
                continue  # a new leader is known: no backoff
            with contextlib.suppress(TimeoutError):
                # Sleep the backoff, unless the leader watch names a new leader meanwhile.
                await asyncio.wait_for(self._redirected.wait(), pause)

    def _session_ended(self, *, failed: bool) -> None:
        """A session ended; one that had not joined yet is a failed join, unless it only
        moved to a new leader (``failed`` False)."""
        if self._round.failed() and failed and not self.kafka_group:
            self._events.on_join(False, None)

    async def _one_session(self) -> None:
        stub = self.follower.stub(assigner_pb2_grpc.AssignerServiceStub)
        self._outbox = asyncio.Queue()
        self._outbox.put_nowait(self._join())
        outbox = self._outbox
        call = stub.Session(self._requests(outbox))
        self._round.start()
        self._heard_at = time.monotonic()
        heartbeats = asyncio.create_task(self._heartbeat_loop(call))
        try:
            async for response in call:
                self._heard_at = time.monotonic()
                await self._handle(response)
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
            # End the request stream: gRPC's task reading it would otherwise wait on the
            # outbox forever once the call ended (a refused or broken session), and be
            # destroyed pending ("Task was destroyed but it is pending!").
            outbox.put_nowait(None)
            call.cancel()

    def _join(self) -> assigner_pb2.SessionRequest:
        if self.kafka_group:
            # Never the Kafka-assigned partitions (epoch 0 would adopt a fresh lease).
            held = [
                types_pb2.LeaseRef(topic=tp.topic, partition=tp.partition, epoch=epoch)
                for tp, epoch in sorted(self._nominal.items())
            ]
        else:
            # Leases only: a partition Kafka assigned (epoch 0, left from kafka_group mode
            # while switching back) is no lease, and epoch 0 would adopt a fresh one.
            held = [
                types_pb2.LeaseRef(topic=p.tp.topic, partition=p.tp.partition, epoch=p.epoch)
                for p in self.keeper.table.snapshot()
                if not p.revoking and p.epoch != UNLEASED_EPOCH
            ]
        ident = self.identity
        return assigner_pb2.SessionRequest(
            join=assigner_pb2.SessionJoin(
                sidecar_id=ident.sidecar_id,
                group=ident.group,
                endpoint=ident.endpoint,
                zone=ident.zone,
                capacity=ident.capacity,
                held_leases=held,
                local_endpoint=ident.local_endpoint,
            )
        )

    async def _requests(
        self, outbox: asyncio.Queue[assigner_pb2.SessionRequest | None]
    ) -> AsyncIterator[assigner_pb2.SessionRequest]:
        while True:
            request = await outbox.get()
            if request is None:
                return  # the session ended
            if request.WhichOneof("kind") == "heartbeat":
                named = {(TP(p.topic, p.partition), p.epoch) for p in request.heartbeat.leases}
                self._sent_at[request.heartbeat.seq] = (time.monotonic(), named)
                self._events.on_heartbeat_sent()
            yield request

    async def _heartbeat_loop(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        """Heartbeats every interval (or at once when asked); and the session's watchdog:
        a stream on which nothing arrived for a TTL plus an interval (heartbeat acks come
        every interval) is cancelled and the session re-joins. A stream can go silent
        without ending: seen when the assigner ended it (a mode switch's rejoin_all) just
        as a heartbeat was being written, and a half-open connection does the same."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_now.wait(), self.heartbeat_interval)
            self._heartbeat_now.clear()
            silent = time.monotonic() - self._heard_at
            if silent > self.ttl + self.heartbeat_interval:
                log.warning(
                    "assigner session silent; re-joining",
                    silent_seconds=round(silent, 2),
                    assigner=self.assigner,
                )
                call.cancel()
                return
            if self.connected:
                self._outbox.put_nowait(self._heartbeat())

    def _heartbeat(self) -> assigner_pb2.SessionRequest:
        self._seq += 1
        if self.kafka_group:
            return self._nominal_heartbeat()
        now = time.monotonic()
        progress = [
            assigner_pb2.LeaseProgress(
                topic=p.tp.topic,
                partition=p.tp.partition,
                epoch=p.epoch,
                position=p.position,
                committed_offset=p.committed,
                lag=p.reported_lag(),
                bytes_per_second=p.take_rate(now),
                fenced_by_kafka=p.kafka_fenced,
            )
            for p in self.keeper.table.snapshot()
            if not p.revoking and p.epoch != UNLEASED_EPOCH
        ]
        released = [
            assigner_pb2.ReleasedLease(
                topic=r.tp.topic,
                partition=r.tp.partition,
                epoch=r.epoch,
                committed_offset=r.committed,
            )
            for r in self.keeper.take_released()
        ]
        external = [
            assigner_pb2.ExternalCommit(
                topic=p.tp.topic,
                partition=p.tp.partition,
                epoch=p.epoch,
                previous_offset=p.committed,
                committed_offset=offset,
                metadata=metadata,
            )
            for p, offset, metadata in self.keeper.committer.external_commits()
        ]
        external += [
            assigner_pb2.ExternalCommit(
                topic=r.tp.topic,
                partition=r.tp.partition,
                epoch=r.epoch,
                previous_offset=r.restored,
                committed_offset=r.external,
                metadata=r.metadata,
                reverted=True,
            )
            for r in self.keeper.committer.take_reverted()
        ]
        return assigner_pb2.SessionRequest(
            heartbeat=self._with_reports(
                assigner_pb2.SessionHeartbeat(
                    seq=self._seq,
                    leases=progress,
                    released_leases=released,
                    external_commits=external,
                )
            )
        )

    def _with_reports(
        self, heartbeat: assigner_pb2.SessionHeartbeat
    ) -> assigner_pb2.SessionHeartbeat:
        """The heartbeat with what the sidecar reports whatever its mode: the config it
        runs (or refused) and its clients' totals."""
        heartbeat.clients.extend(
            assigner_pb2.ClientActivity(
                client_id=c.client_id,
                records_served=c.records,
                acks=c.acks,
                errors=c.errors,
                requests=c.requests,
                last_seen_seconds=c.last_seen,
                active_streams=c.active_streams,
            )
            for c in self.client_activity()
        )
        version, rejected = self.config_status()
        heartbeat.applied_config_version = version
        if rejected is not None:
            heartbeat.config_rejection.config_version = rejected[0]
            heartbeat.config_rejection.reason = rejected[1]
        return heartbeat

    def _nominal_heartbeat(self) -> assigner_pb2.SessionRequest:
        progress = [
            assigner_pb2.LeaseProgress(
                topic=tp.topic,
                partition=tp.partition,
                epoch=epoch,
                position=-1,
                committed_offset=-1,
                lag=-1,
            )
            for tp, epoch in sorted(self._nominal.items())
        ]
        released, self._nominal_released = self._nominal_released, []
        released += self.keeper.take_released()
        return assigner_pb2.SessionRequest(
            heartbeat=self._with_reports(
                assigner_pb2.SessionHeartbeat(
                    seq=self._seq,
                    leases=progress,
                    released_leases=[
                        assigner_pb2.ReleasedLease(
                            topic=r.tp.topic,
                            partition=r.tp.partition,
                            epoch=r.epoch,
                            committed_offset=r.committed,
                        )
                        for r in released
                    ],
                )
            )
        )

    def _learn_mode(self, acc: assigner_pb2.SessionAccepted) -> None:
        mode = acc.mode or common_pb2.GROUP_MODE_LEASED  # an older assigner sends none
        if self.mode == common_pb2.GROUP_MODE_UNSPECIFIED:
            log.info("group mode", mode=common_pb2.GroupMode.Name(mode))
        elif mode != self.mode:
            # A mode switch: the assigner revoked every lease (to kafka_group) or waits for
            # Kafka's group to empty (to leased) before it grants; on_accepted switches the
            # consumer. Nominal leases of kafka_group mode end with it.
            log.info(
                "group mode changed: switching",
                running=common_pb2.GroupMode.Name(self.mode),
                mode=common_pb2.GroupMode.Name(mode),
            )
            self._nominal.clear()
        self.mode = mode
        self._events.on_accepted(acc)

    def _handle_nominal(self, response: assigner_pb2.SessionResponse) -> None:
        """kafka_group mode: a lease grant or revoke from an assigner that still runs the
        lease coordinator for this group. Hold it on paper; never fetch it."""
        kind = response.WhichOneof("kind")
        if kind == "grant":
            g = response.grant
            tp = TP(g.topic, g.partition)
            if g.epoch > self._nominal.get(tp, -1):
                self._nominal[tp] = g.epoch
        elif kind == "revoke":
            r = response.revoke
            tp = TP(r.topic, r.partition)
            if self._nominal.get(tp, r.epoch) <= r.epoch:
                self._nominal.pop(tp, None)
            self._nominal_released.append(ReleasedLease(tp, r.epoch, -1))
            self._heartbeat_now.set()

    async def _handle(self, response: assigner_pb2.SessionResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind in ("grant", "revoke") and self.kafka_group:
            self._handle_nominal(response)
            return
        if kind == "accepted":
            acc = response.accepted
            self._apply_timing(acc)
            self.session_id = acc.session_id
            self.connected = True
            log.info("joined", assigner=self.assigner, session=acc.session_id, ttl=self.ttl)
            self._learn_mode(acc)
            if not self.kafka_group and not self.keeper.table.snapshot():
                # A fresh start (a restart, a scale-out): its first grants are on their way
                # (a handoff's revoke, drain and release); the coordinator lookup and the
                # connection their assign needs are made meanwhile, not after they came.
                self._tasks.spawn(self.keeper.warm_up(list(acc.topics)))
            joined = self._round.joined()
            if not self.kafka_group:
                self._events.on_join(True, joined)
            self._events.on_config(acc.config_version, dict(acc.consumer_config))
            self._delivery_policy(acc, acc.config_version)
            self._heartbeat_now.set()
        elif kind == "config_update":
            update = response.config_update
            if update.config_version >= self._config_version:  # not an older update's
                self._apply_timing(update)
            self._events.on_config(update.config_version, dict(update.consumer_config))
            self._delivery_policy(update, update.config_version)
        elif kind == "grant":
            if (synced := self._round.assigned()) is not None:
                self._events.on_sync(synced)  # the session's first grant: its assignment arrived
            g = response.grant
            tp = TP(g.topic, g.partition)
            # Held, fetched, but live only once a heartbeat that names it is acked with a
            # renewal (ARCHITECTURE §3.1.6): send that heartbeat now.
            if self.keeper.grant(tp, g.epoch, time.monotonic()):
                self._heartbeat_now.set()
                # Grants come in bursts: gather those that arrive together into one assign.
                if not self._grants:
                    self._tasks.spawn(self._start_granted())
                self._grants[tp] = g.start_offset
        elif kind == "revoke":
            r = response.revoke
            if r.reason == assigner_pb2.REVOKE_REASON_FENCED:
                # Our epoch is stale: the partition is someone else's. Commit nothing.
                self._tasks.spawn(self.keeper.fence(TP(r.topic, r.partition), r.epoch))
            else:
                drain = r.drain_timeout.ToTimedelta().total_seconds()
                # CONFIG (an offset reset, a mode switch): this epoch ends for good.
                retire = r.reason == assigner_pb2.REVOKE_REASON_CONFIG
                self._tasks.spawn(
                    self.keeper.revoke(TP(r.topic, r.partition), r.epoch, drain, retire=retire)
                )
        elif kind == "heartbeat_ack":
            ack = response.heartbeat_ack
            entry = self._sent_at.pop(ack.seq, None)
            for old in [s for s in self._sent_at if s < ack.seq]:
                del self._sent_at[old]
            if entry is not None:
                sent, named = entry
                self._events.on_heartbeat_acked(time.monotonic() - sent)
                deadline = sent + self.ttl - self.margin
                renewed = {(TP(x.topic, x.partition), x.epoch) for x in ack.renewed_leases}
                for tp, epoch in renewed:
                    self.keeper.renew(tp, epoch, deadline)
                self.keeper.not_renewed(renewed, sent, named)

    def _apply_timing(
        self, config: assigner_pb2.SessionAccepted | assigner_pb2.ConfigUpdate
    ) -> None:
        """The group's lease TTL and heartbeat interval (unset or zero: unchanged), and
        what derives from them: the delivery margin and the stall limit. From a
        SessionAccepted, or a ConfigUpdate changing a kafka-fenced group's timing live."""
        before = (self.ttl, self.heartbeat_interval)
        self.ttl = config.lease_ttl.ToTimedelta().total_seconds() or self.ttl
        self.heartbeat_interval = (
            config.heartbeat_interval.ToTimedelta().total_seconds() or self.heartbeat_interval
        )
        self.keeper.table.delivery_margin = delivery_margin_for(
            self.delivery_margin, self.ttl, self.margin, self.heartbeat_interval
        )
        self.keeper.table.stall.limit = stall_limit_for(self.ttl, self.heartbeat_interval)
        if isinstance(config, assigner_pb2.ConfigUpdate) and before != (
            self.ttl,
            self.heartbeat_interval,
        ):
            log.info("group timing changed", ttl=self.ttl, heartbeat=self.heartbeat_interval)
            self._heartbeat_now.set()  # wake the heartbeat loop: its interval changed

    def config_changed(self) -> None:
        """What runs of the group's config changed: report it in a heartbeat now."""
        self._heartbeat_now.set()

    def _delivery_policy(
        self, config: assigner_pb2.SessionAccepted | assigner_pb2.ConfigUpdate, version: int
    ) -> None:
        """The group's visibility timeout and delivery limit, as of config ``version``
        (an update older than the one applied is ignored)."""
        if version < self._config_version:
            return
        self._config_version = version
        visibility = (
            config.visibility_timeout.ToTimedelta().total_seconds()
            if config.HasField("visibility_timeout")
            else None
        )
        self._events.on_delivery_policy(visibility, config.max_deliveries, config.dead_letter_topic)
        self._events.on_external_changes(
            EXTERNAL_OFFSET_CHANGES.get(config.external_offset_changes, "follow")
        )
        self._events.on_ordering(ORDERINGS.get(config.ordering, "unordered"))
        self._events.on_commit_fencing(COMMIT_FENCINGS.get(config.commit_fencing, ""))

    def external_found(self) -> None:
        """A commit this sidecar did not make was found: report it in a heartbeat now."""
        self._heartbeat_now.set()

    async def _start_granted(self) -> None:
        await asyncio.sleep(0.01)
        grants, self._grants = self._grants, {}
        await self.keeper.start_fetching(grants)

    def _holds_leases(self) -> bool:
        return bool(self._nominal) if self.kafka_group else bool(self.keeper.table.snapshot())

    async def leave(self, timeout: float) -> None:
        """Graceful leave: ask the assigner to revoke everything, release it, then stop."""
        if self.connected:
            request = assigner_pb2.LeaveRequest(
                sidecar_id=self.identity.sidecar_id,
                group=self.identity.group,
                session_id=self.session_id,
                graceful=True,
            )
            try:
                stub = self.follower.stub(assigner_pb2_grpc.AssignerServiceStub)
                await stub.Leave(request, timeout=2)
            except grpc.RpcError as err:
                info = error_info(err)
                if info is not None and info.reason == Reason.SIDECAR_NOT_FOUND:
                    # The preStop hand-off (dsctl handoff) left the group already.
                    log.info("already left the group")
                else:
                    log.warning("leave failed; releasing leases directly", error=str(err))
            end = time.monotonic() + timeout
            while self._holds_leases() and time.monotonic() < end:
                await asyncio.sleep(0.05)
        if self.kafka_group:
            # Kafka's partitions are handed back by the app (classic drain), not here.
            for tp, epoch in self._nominal.items():
                self._nominal_released.append(ReleasedLease(tp, epoch, -1))
            self._nominal.clear()
        else:
            # Whatever the assigner did, release what is left (commits acked offsets).
            await self.keeper.release_all(drain_timeout=max(0.0, timeout / 2))
        self._heartbeat_now.set()
        await asyncio.sleep(0.2)  # let the final heartbeat with the releases go out
        self._stopping = True
