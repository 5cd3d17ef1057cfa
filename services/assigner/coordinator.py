"""Group coordination: members, leases with fencing epochs, cooperative handoff (pure).

One :class:`GroupCoordinator` per group. It does no I/O and reads no clock: every event
(join, heartbeat, leave, move, tick) passes ``now`` (monotonic seconds) and returns the
commands to send (:class:`GrantCmd`, :class:`RevokeCmd`). The RPC layer turns those into
Session messages, after persisting new epochs. The rules (ARCHITECTURE §3, §3.1):

* a lease is renewed only by a heartbeat of its holder naming its current epoch, and only
  while it is ``GRANTED``; the assigner's view of its expiry is receive time + TTL + grace,
  and a lease lapses at that expiry, never earlier (whatever happened to its member),
  except a lease whose commits are fenced at Kafka when its member's session closed and
  it did not attach again within the reconnect window (:meth:`GroupCoordinator.disconnected`);
* a partition moves cooperatively: revoke -> holder commits and releases -> grant to the
  chosen next holder with epoch + 1, which starts at what Kafka holds (the offsets a
  holder reports are its word: shown, never a start offset); a holder that does not
  release is waited out until its lease expires (it stops by itself before that);
* a member that misses heartbeats for TTL + grace is lost; its partitions are balanced
  over the others as their leases lapse (start offset = the group's committed offset);
* static identity: a member that leaves *gracefully* keeps its place for the hold window,
  and if it re-joins in time it gets exactly its partitions back. How they spend the window
  is the :class:`HoldMode`: ``HANDOFF`` (the default) hands them to the others at once, as
  a rebalance would, and takes them back by cooperative handoffs when it returns (no gap;
  each moves twice); ``RESERVE`` keeps them released (committed) and reserved for it
  (nothing else moves; nobody reads them until it returns or the window ends, then they
  are balanced over the others). (A lost member gets no hold: it did not hand off.)
* after a restart (state rebuilt from the state topic: epochs, no holders) the group
  *settles* for TTL + grace: re-attaching sidecars adopt the leases they hold with the
  current epoch, and nothing is granted until every lease that was valid before the
  restart would have expired — so a restart moves no partition;
* an offset reset *pauses* partitions (:meth:`GroupCoordinator.pause`): each is taken from
  its holder like a handoff (revoke, release or expiry) but reserved for it, granted to
  nobody, and given back to the same member under a new epoch at the new offset
  (:meth:`GroupCoordinator.resume`) — the fencing rules above, and no partition moves;
* a drained member (:meth:`GroupCoordinator.set_drained`) stays connected with capacity 0:
  the balancer moves its partitions off, cooperatively, and gives it none until undrained;
* a mode switch stops granting and revokes every lease cooperatively
  (:meth:`GroupCoordinator.stop_granting`), and starts granting again at the committed
  offsets (:meth:`GroupCoordinator.start_granting`);
* a grant is decided here but sent by the adapter only once its epoch is durable. Its
  expiry runs from the decision and again from the moment it is sent
  (:meth:`GroupCoordinator.dispatched`); a grant whose lease lapsed or moved on while its
  epoch was being written is never sent, and a grant whose write failed is taken back
  (:meth:`GroupCoordinator.withheld`) and decided again. The sidecar side of the same
  rule: a grant is live there only from the first heartbeat sent after it that the
  assigner acknowledges (ARCHITECTURE §3.1.6).

One job, why whole (about 900 lines): the lease rules of one group as one pure state
machine. Every event handler reads and writes the same leases, holds, pauses and epochs, and
the fencing invariants (one holder per epoch, no grant before the old holder's lease ran
out) hold across all of them; split by event, each part would need the whole state and the
invariants would have no single home. Its pure parts that stand alone already live beside it
(balancer.py, reset_targets.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from services.assigner.balancer import BalanceInput, Member, Strategy, rebalance
from services.runtime.topic_partition import TopicPartition

# start_offset value meaning "resume from the group's committed offset in Kafka".
COMMITTED = -1
# In LOAD mode weights drift continuously; the tick re-balances on them this often.
LOAD_REBALANCE_SECONDS = 10.0


def _nothing() -> None:
    pass


class LeaseState(enum.Enum):
    FREE = "free"
    GRANTED = "granted"
    REVOKING = "revoking"


class RevokeWhy(enum.Enum):
    REBALANCE = "rebalance"
    MOVE = "move"
    SHUTDOWN = "shutdown"
    FENCED = "fenced"
    RESET = "reset"  # an offset reset pauses the partition: release at once, no drain
    CONFIG = "config"  # a mode switch: drain, commit, release; nothing is granted after


@dataclass(frozen=True)
class GrantCmd:
    member: str
    tp: TopicPartition
    epoch: int
    start_offset: int


@dataclass(frozen=True)
class RevokeCmd:
    member: str
    tp: TopicPartition
    epoch: int
    reason: RevokeWhy


Command = GrantCmd | RevokeCmd


@dataclass
class Lease:
    tp: TopicPartition
    epoch: int = 0
    holder: str | None = None
    state: LeaseState = LeaseState.FREE
    expires_at: float = 0.0  # assigner view: last renewal receive time + TTL + grace
    next_holder: str | None = None  # handoff target while REVOKING
    # The last committed offset the holder reported: its word, shown and audited, never a
    # start offset (a sidecar's heartbeat must not move offsets: issue 37, finding 3).
    committed: int = COMMITTED
    # Where the next grant starts: COMMITTED (the next holder reads what Kafka holds), or
    # the offset the assigner itself committed in an offset reset, for the grant after it.
    start: int = COMMITTED
    # After a restart: the member the current epoch was granted to, from durable state; only
    # it may adopt the lease by naming the epoch (an epoch is no proof: viewers read them).
    # None: not known (a record from before holders were kept, or a reset's epoch).
    granted_to: str | None = None
    # The holder's heartbeats report this epoch's commits fenced at Kafka (commit_fencing:
    # kafka: a transactional producer per lease, fenced when the next holder initialises
    # the same transactional id). Only such a lease may move before its expiry when its
    # holder's session closes (:meth:`GroupCoordinator.disconnected`): its safety does
    # not rest on time. False until the holder's first heartbeat under the epoch says so.
    kafka_fenced: bool = False


@dataclass
class MemberInfo:
    id: str
    endpoint: str
    session_id: str
    zone: str | None = None
    capacity: int | None = None
    last_seen: float = 0.0
    joined_at: float = 0.0
    leaving: bool = False  # Leave received; releasing its leases
    held_until: float | None = None  # gone gracefully; its place is kept until then
    # HANDOFF: what it held when it left, handed back if it returns within its window.
    previous: tuple[TopicPartition, ...] = ()
    local_endpoint: str = ""  # unix:PATH for an application in the sidecar's pod
    # Its Session stream ended without a Leave (the process died, or the connection
    # broke): given ``Timing.reconnect_window`` to attach again before it is gone.
    disconnected_at: float | None = None

    @property
    def present(self) -> bool:
        """Connected and serving (not leaving, not away within its hold window)."""
        return not self.leaving and self.held_until is None


@dataclass(frozen=True)
class HeldLease:
    tp: TopicPartition
    epoch: int


@dataclass(frozen=True)
class Released:
    tp: TopicPartition
    epoch: int
    committed: int


@dataclass(frozen=True)
class Progress:
    tp: TopicPartition
    epoch: int
    committed: int = COMMITTED
    bytes_per_second: float = 0.0
    lag: int = -1
    kafka_fenced: bool = False  # the holder commits this lease through Kafka's fencing


# LOAD strategy: a partition's weight is its observed bytes/s, raised for a backlog: a
# partition LAG_FULL records behind counts double (it needs catching up, not just keeping
# up). A heuristic, documented as such; weights only steer the balancer in LOAD mode.
LAG_FULL = 10_000


def partition_weight(bytes_per_second: float, lag: int) -> float:
    backlog = min(max(lag, 0) / LAG_FULL, 1.0)
    return max(bytes_per_second, 0.0) * (1.0 + backlog)


class HoldMode(enum.Enum):
    """What a gracefully-left member's partitions do during its hold window (issue 22,
    item 5: a graceful stop must leave no partition unread, so HANDOFF is the default)."""

    HANDOFF = "handoff"  # go to the others at once; handed back when it returns (no gap)
    RESERVE = "reserve"  # wait, released and unread, for it to return (moves nothing)


@dataclass(frozen=True)
class Timing:
    ttl: float = 3.0
    grace: float = 1.0
    hold_window: float = 10.0  # 0 disables static identity
    hold_mode: HoldMode = HoldMode.HANDOFF
    # Events (a join, a release) rebalance at once while the balancer work spent within
    # this interval (partitions + members, per run) stays within ``rebalance_work``;
    # past it they only mark one pending and the next tick runs one for them all. A
    # storm of N joins to a large group then costs about a rebalance per tick, not N
    # (each is O(partitions + members), and moves partitions again); small groups never
    # wait (10,000 is about 10 ms of balancer: a group of 100 partitions and members
    # rebalances up to 100 times within an interval). 0: every event rebalances at once.
    rebalance_interval: float = 0.0
    rebalance_work: int = 10_000
    # A member whose Session stream ended without a Leave is gone once this long has
    # passed without it attaching again (a killed sidecar's socket is closed by its
    # kernel at once; a broken connection is re-attached within it). Its Kafka-fenced
    # leases then lapse at once instead of at TTL + grace; its other leases keep their
    # expiry (their safety is the holder's deadline).
    reconnect_window: float = 1.0

    @property
    def reserves(self) -> bool:
        """A leaving member's partitions wait for it (RESERVE within a hold window)."""
        return self.hold_window > 0 and self.hold_mode is HoldMode.RESERVE

    @property
    def expiry(self) -> float:
        return self.ttl + self.grace


@dataclass
class Outcome:
    """What an event produced: commands to send and whether membership changed."""

    commands: list[Command] = field(default_factory=list)
    renewed: list[HeldLease] = field(default_factory=list)
    membership_changed: bool = False
    lost: list[str] = field(default_factory=list)
    held_expired: list[str] = field(default_factory=list)
    # Leases that lapsed at their expiry in this event (metrics only).
    expired: list[TopicPartition] = field(default_factory=list)
    # Members whose session closed without a Leave and who did not attach again within
    # the reconnect window: gone (their Kafka-fenced leases lapsed at once).
    disconnected: list[str] = field(default_factory=list)


class GroupCoordinator:
    def __init__(
        self,
        group: str,
        partitions: Iterable[TopicPartition],
        timing: Timing | None = None,
        *,
        epochs: Mapping[TopicPartition, int] | None = None,
        holders: Mapping[TopicPartition, str] | None = None,
        settle_until: float = 0.0,
        strategy: Strategy = Strategy.COUNT,
        grants_enabled: bool = True,
    ) -> None:
        """``epochs`` restores the last epochs from durable state, ``holders`` the member
        each was granted to; with them pass ``settle_until`` = start time + TTL + grace
        (see the module docstring)."""
        self.group = group
        self.timing = timing or Timing()
        self.members: dict[str, MemberInfo] = {}
        self.leases: dict[TopicPartition, Lease] = {}
        self.settle_until = settle_until
        self.strategy = strategy
        # False for a kafka_group-mode group: Kafka's group coordinator assigns its
        # partitions; the assigner only tracks membership (and pushes config).
        self.grants_enabled = grants_enabled
        self.weights: dict[TopicPartition, float] = {}  # LOAD mode, from heartbeats
        # Offset resets in progress: paused partition -> the member it goes back to.
        self.paused: dict[TopicPartition, str | None] = {}
        # Members an operator drained: capacity 0 until undrained (persisted by the adapter).
        self.drained: set[str] = set()
        # The tick rebalances only when something changed (or a settle period ended), and
        # in LOAD mode at most every LOAD_REBALANCE_SECONDS as weights drift: a full
        # balancer run on every 100 ms tick would cost O(partitions) for nothing.
        self._rebalance_pending = True
        self._last_load_rebalance = float("-inf")
        # The current coalescing window: its start and the balancer work spent in it.
        self._work_since = float("-inf")
        self._work = 0
        # The tick's scan of every member and lease is skipped before this time: the
        # earliest deadline (member expiry, hold window end, lease expiry) as of the last
        # scan. A plain heartbeat only moves deadlines later, so it keeps it; every other
        # input may bring one earlier (or start a leave) and sets it back to -inf (a scan
        # at the next tick). At 1,000 sidecars the scan on each 100 ms tick was a tenth of
        # the assigner's CPU.
        self._scan_at = float("-inf")
        # Called when an input may have brought a deadline nearer or left a rebalance
        # pending (:meth:`_rescan`): the adapter's tick loop sleeps until :meth:`due` and
        # is woken by it (an idle assigner does not tick 10 times a second; issue 34).
        self.on_sooner: Callable[[], None] = _nothing
        self.set_partitions(partitions)
        for tp, epoch in (epochs or {}).items():
            if tp in self.leases:
                self.leases[tp].epoch = epoch
                self.leases[tp].granted_to = (holders or {}).get(tp)

    # ---- inputs -------------------------------------------------------------------------

    def set_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        self._rescan()
        for tp in partitions:
            if tp not in self.leases:
                self.leases[tp] = Lease(tp)
                self._pend_rebalance()

    def join(self, member: MemberInfo, held: Sequence[HeldLease], now: float) -> Outcome:
        """A sidecar (re-)attached. Leases it still holds with the current epoch stay put;
        after an assigner restart it adopts them; older epochs are fenced."""
        self._rescan()
        previous = self.members.get(member.id)
        out = Outcome(membership_changed=previous is None or not previous.present)
        member.last_seen = now
        member.joined_at = previous.joined_at if previous and previous.present else now
        self.members[member.id] = member
        if (
            previous is not None
            and previous.held_until is not None
            and self.timing.hold_mode is HoldMode.HANDOFF
            and self.grants_enabled
        ):
            # Back within its hold window: its partitions come back to it by cooperative
            # handoffs from whoever took them (RESERVE kept them free for it instead).
            for tp in previous.previous:
                lease = self.leases.get(tp)
                if lease is not None and tp not in self.paused and self._can_take(member.id):
                    out.commands.extend(self._redirect(lease, member.id, now, RevokeWhy.REBALANCE))
        for h in held if self.grants_enabled else ():
            lease = self.leases.get(h.tp)
            if lease is None:
                continue
            if lease.holder == member.id and lease.epoch == h.epoch:
                if lease.state is LeaseState.GRANTED:
                    lease.expires_at = now + self.timing.expiry
                    out.renewed.append(h)
            elif h.tp in self.paused:
                # Released or lapsed for an offset reset: whatever the sidecar still has of
                # it is from before the reset. Nothing of it may be committed.
                out.commands.append(RevokeCmd(member.id, h.tp, h.epoch, RevokeWhy.FENCED))
            elif (
                lease.state is LeaseState.FREE
                and lease.epoch == h.epoch
                and lease.granted_to in (None, member.id)
            ):
                # Rebuilt after a restart: the holder's word plus the epoch, and the member
                # it was granted to, from durable state. Epochs and holders are persisted
                # before a grant is sent, so nobody else can hold this epoch; anyone else
                # naming it (epochs are visible to viewers) is fenced below.
                lease.holder = member.id
                lease.state = LeaseState.GRANTED
                lease.expires_at = now + self.timing.expiry
                out.renewed.append(h)
            elif (
                h.epoch < lease.epoch
                or lease.holder not in (None, member.id)
                or lease.granted_to not in (None, member.id)
            ):
                out.commands.append(RevokeCmd(member.id, h.tp, h.epoch, RevokeWhy.FENCED))
        # A revoke sent on the broken stream may have been lost: send it again.
        for lease in self.held_by(member.id):
            if lease.state is LeaseState.REVOKING:
                out.commands.append(
                    RevokeCmd(member.id, lease.tp, lease.epoch, self._revoke_reason(lease.tp))
                )
        out.commands.extend(self._rebalance(now))
        return out

    def heartbeat(
        self,
        member_id: str,
        progress: Sequence[Progress],
        released: Sequence[Released],
        now: float,
    ) -> Outcome:
        out = Outcome()
        member = self.members.get(member_id)
        if member is None:
            return out
        member.last_seen = now
        if released:
            self._rescan()  # a release may end a leave or grant elsewhere
        for r in released:
            out.commands.extend(self._on_release(member_id, r, now))
        for p in progress:
            lease = self.leases.get(p.tp)
            if (
                lease is not None
                and lease.holder == member_id
                and lease.epoch == p.epoch
                and lease.state is LeaseState.GRANTED
            ):
                lease.expires_at = now + self.timing.expiry
                lease.kafka_fenced = p.kafka_fenced
                if p.committed >= 0:
                    lease.committed = p.committed
                self.weights[p.tp] = partition_weight(p.bytes_per_second, p.lag)
                out.renewed.append(HeldLease(p.tp, p.epoch))
        if released:
            self._finish_leave_if_done(member_id, now, out)
        return out

    def leave(self, member_id: str, now: float) -> Outcome:
        """Graceful leave: revoke everything the member holds; when it has released all,
        its place is kept for the hold window (static identity)."""
        self._rescan()
        member = self.members.get(member_id)
        out = Outcome()
        if member is None or member.leaving:
            return out
        member.leaving = True
        out.membership_changed = True
        member.previous = tuple(lease.tp for lease in self.held_by(member_id))
        for lease in self.held_by(member_id):
            if lease.state is LeaseState.GRANTED:
                lease.state = LeaseState.REVOKING
                # RESERVE: the partition stays reserved for the member; else the balancer
                # picks its next holder among the others when it is released.
                lease.next_holder = member_id if self.timing.reserves else None
                out.commands.append(RevokeCmd(member_id, lease.tp, lease.epoch, RevokeWhy.SHUTDOWN))
        self._finish_leave_if_done(member_id, now, out)
        return out

    def abandon(self, member_id: str, now: float) -> Outcome:
        """Non-graceful leave: the member is gone now; its leases lapse at their expiry
        (it may still be serving until its own deadline) and then move."""
        self._rescan()
        out = Outcome()
        if self.members.pop(member_id, None) is not None:
            out.membership_changed = True
            out.commands.extend(self._rebalance(now))
        return out

    def disconnected(self, member_id: str, now: float) -> Outcome:
        """The member's Session stream ended without a Leave (issue 36: kill -9 within
        4 s). It is given the reconnect window to attach again (a join replaces it and
        keeps its leases, as after any broken stream); past it, the tick declares it gone
        and its Kafka-fenced leases lapse at once: their next holder's transactional
        producer fences whatever the old one might still commit, so no clock is needed.
        Its other leases lapse at their expiry as before (the holder may serve them until
        its own deadline). Meanwhile it is given no new partition."""
        member = self.members.get(member_id)
        out = Outcome()
        if member is None or not member.present or member.disconnected_at is not None:
            return out  # leaving (its leave finishes by releases or expiry), away, or gone
        member.disconnected_at = now
        self._rescan()
        return out

    def move(self, tp: TopicPartition, target: str, now: float) -> Outcome:
        """Operator move (MoveLease): hand ``tp`` to ``target``. If that would break the
        count balance, the target hands one of its partitions back in exchange, so the
        balancer has nothing to undo."""
        self._rescan()
        out = Outcome()
        lease = self.leases[tp]
        source = self._intended_holder(lease)
        if source == target or tp in self.paused:
            return out
        counts = self._intended_counts()
        swap: Lease | None = None
        if source is not None and counts.get(target, 0) + 1 - (counts.get(source, 0) - 1) > 1:
            candidates = [
                other
                for other in self.held_by(target)
                if other.state is LeaseState.GRANTED and other.tp != tp
            ]
            swap = candidates[0] if candidates else None
        out.commands.extend(self._redirect(lease, target, now, RevokeWhy.MOVE))
        if swap is not None and source is not None:
            out.commands.extend(self._redirect(swap, source, now, RevokeWhy.MOVE))
        return out

    # ---- offset resets: pause, new epochs, resume --------------------------------------

    def pause(self, tps: Iterable[TopicPartition], now: float) -> Outcome:
        """Offset reset, step 1: take ``tps`` from their holders without moving them.

        A held partition is revoked (RESET: no drain — the holder drops its buffer and what
        is in flight, commits what was acked and releases); one in a handoff finishes it; a
        free one stays free. Each is reserved for the member that holds it (or would next),
        and none is granted to anyone until :meth:`resume` or :meth:`unpause`. A holder that
        does not release is waited out until its lease expires, as in any handoff."""
        self._rescan()
        out = Outcome()
        for tp in sorted(tps):
            lease = self.leases[tp]
            if tp in self.paused:
                continue
            self.paused[tp] = self._intended_holder(lease)
            if lease.state is LeaseState.GRANTED:
                assert lease.holder is not None
                lease.state = LeaseState.REVOKING
                lease.next_holder = lease.holder
                out.commands.append(RevokeCmd(lease.holder, tp, lease.epoch, RevokeWhy.RESET))
        return out

    def is_paused(self, tps: Iterable[TopicPartition]) -> bool:
        """Whether every partition of ``tps`` is paused and held by nobody (released, or
        its lease lapsed): nothing can commit it any more but the assigner."""
        return all(tp in self.paused and self.leases[tp].holder is None for tp in tps)

    def reset_epochs(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Offset reset, step 2: a new epoch for each paused partition, under which its new
        offset is committed and it is granted back (:meth:`resume` does not bump it again).
        The adapter persists them before it commits."""
        self._rescan()
        epochs = {}
        for tp in sorted(tps):
            lease = self.leases[tp]
            if not self.is_paused([tp]):
                raise ValueError(f"{tp} is not paused")
            lease.epoch += 1
            lease.granted_to = None  # granted back by resume(), which names it
            epochs[tp] = lease.epoch
        return epochs

    def resume(self, offsets: Mapping[TopicPartition, int], now: float) -> Outcome:
        """Offset reset, step 3, once the new offsets are committed: each partition goes
        back to the member it was reserved for, under its :meth:`reset_epochs` epoch, at its
        new offset. One whose member cannot take it any more (gone, drained) is balanced
        over the others like any free partition, starting at the new offset too."""
        self._rescan()
        out = Outcome()
        for tp, offset in sorted(offsets.items()):
            holder = self.paused.pop(tp, None)
            lease = self.leases[tp]
            lease.committed = offset
            lease.start = offset
            lease.next_holder = None
            if (
                holder is not None
                and lease.holder is None
                and self._can_take(holder)
                and self.grants_enabled
                and now >= self.settle_until
            ):
                out.commands.append(self._grant(lease, holder, now, new_epoch=False))
        out.commands.extend(self._rebalance(now, coalesce=False))
        return out

    def unpause(self, tps: Iterable[TopicPartition], now: float) -> Outcome:
        """A reset that committed nothing: the partitions are granted again as after any
        handoff (a new epoch, at what Kafka holds)."""
        self._rescan()
        for tp in tps:
            if self.paused.pop(tp, None) is not None:
                self.leases[tp].next_holder = None
        self._pend_rebalance()
        return Outcome(commands=self._rebalance(now, coalesce=False))

    # ---- drains -------------------------------------------------------------------------

    def set_drained(self, member_id: str, drained: bool, now: float) -> Outcome:
        """An operator drains a member (its capacity counts as 0: its partitions move off
        with cooperative handoffs while it stays connected) or ends the drain (it gets its
        share back). Persisting the drain is the adapter's job."""
        self._rescan()
        if drained:
            self.drained.add(member_id)
        else:
            self.drained.discard(member_id)
        self._pend_rebalance()
        return Outcome(commands=self._rebalance(now, coalesce=False), membership_changed=True)

    # ---- mode switches ------------------------------------------------------------------

    def stop_granting(self, now: float) -> Outcome:
        """Switch to kafka_group, step 1: grant nothing from now on, and revoke every held
        lease cooperatively (CONFIG: the holder drains in-flight acks, commits and
        releases). A holder that does not release is waited out until its lease expires;
        :meth:`unheld` tells when no partition has a holder left."""
        self._rescan()
        self.grants_enabled = False
        out = Outcome()
        for tp in sorted(self.leases):
            lease = self.leases[tp]
            lease.next_holder = None
            if lease.state is LeaseState.GRANTED:
                assert lease.holder is not None
                lease.state = LeaseState.REVOKING
                out.commands.append(RevokeCmd(lease.holder, tp, lease.epoch, RevokeWhy.CONFIG))
        return out

    def unheld(self) -> bool:
        """No partition has a holder (every lease released or lapsed)."""
        return all(lease.holder is None for lease in self.leases.values())

    def start_granting(self, now: float) -> Outcome:
        """Granting (re)starts: a switch to leased once Kafka's group is empty, or a switch
        to kafka_group called off. Every free partition starts at the committed offset
        Kafka has (what the classic consumers committed), never at an older report."""
        self._rescan()
        self.grants_enabled = True
        for lease in self.leases.values():
            if lease.holder is None:
                lease.committed = lease.start = COMMITTED
        self._pend_rebalance()
        return Outcome(commands=self._rebalance(now, coalesce=False), membership_changed=True)

    def set_ttl(self, ttl: float) -> None:
        """The TTL members expire by from now on (a live timing change rolling out);
        renewals use it, leases already renewed keep their expiry."""
        if ttl != self.timing.ttl:
            self.timing = replace(self.timing, ttl=ttl)
            self._rescan()  # a shorter TTL may bring a deadline nearer

    def _rescan(self) -> None:
        """The next tick scans: this input may have brought a deadline nearer."""
        self._scan_at = float("-inf")
        self.on_sooner()

    def _pend_rebalance(self) -> None:
        self._rebalance_pending = True
        self.on_sooner()

    def due(self) -> float:
        """When :meth:`disconnect_expired` next has work (monotonic seconds; ``-inf`` or a
        past time: at the next tick; ``inf``: only after an input): the earliest deadline
        as of the last scan, a pending rebalance (once the settle period is over), LOAD's
        periodic one. Inputs that bring it nearer call :attr:`on_sooner`."""
        due = self._scan_at
        if not self.grants_enabled:
            return due  # nothing to balance (kafka_group mode): only member deadlines
        if self._rebalance_pending:
            due = min(due, self.settle_until)
        if self.strategy is Strategy.LOAD:
            due = min(due, self._last_load_rebalance + LOAD_REBALANCE_SECONDS)
        return due

    def disconnect_expired(self, now: float) -> Outcome:
        """Tick: expire silent members, lapsed leases and hold windows; rebalance."""
        out = Outcome()
        load_due = (
            self.strategy is Strategy.LOAD
            and now - self._last_load_rebalance >= LOAD_REBALANCE_SECONDS
        )
        if now < self._scan_at and not self._rebalance_pending and not load_due:
            return out  # no deadline can have passed, nothing waits for a rebalance
        changed = False
        expiry = self.timing.expiry
        earliest = float("inf")
        early: set[TopicPartition] = set()  # Kafka-fenced leases of members gone now
        for member in list(self.members.values()):
            if member.held_until is not None:
                if now >= member.held_until:
                    del self.members[member.id]
                    out.held_expired.append(member.id)
                    out.membership_changed = True
                else:
                    earliest = min(earliest, member.held_until)
            elif now - member.last_seen > expiry:
                del self.members[member.id]
                out.lost.append(member.id)
                out.membership_changed = True
            elif (
                member.disconnected_at is not None
                and now >= member.disconnected_at + self.timing.reconnect_window
            ):
                del self.members[member.id]
                out.disconnected.append(member.id)
                out.membership_changed = True
                early.update(lease.tp for lease in self.held_by(member.id) if lease.kafka_fenced)
            else:
                earliest = min(earliest, member.last_seen + expiry)
                if member.disconnected_at is not None:
                    earliest = min(earliest, member.disconnected_at + self.timing.reconnect_window)
                if member.leaving:
                    earliest = float("-inf")  # its leave ends when its last lease does
        for lease in self.leases.values():
            # A lease lapses at its own expiry, never earlier: even when its member was just
            # declared lost, a lease granted or renewed recently may still be valid on the
            # sidecar's side. Nobody renewing it (member gone, grant lost with a broken
            # stream, a holder ignoring a revoke) means it lapses, and the holder stopped
            # by itself before this moment. The one exception: a Kafka-fenced lease of a
            # member whose session closed and did not come back (``early``): the next
            # holder's producer fences the old one's commits, whatever it still does.
            if lease.holder is not None and (now > lease.expires_at or lease.tp in early):
                # The holder may have committed past its last report: the next owner
                # resumes from what Kafka has, not from our copy.
                lease.committed = COMMITTED
                out.expired.append(lease.tp)
                target = lease.next_holder
                self._free(lease)
                changed = True
                if lease.tp in self.paused:
                    lease.next_holder = target  # reserved; granted back by resume()
                elif target is not None and self._can_take(target) and now >= self.settle_until:
                    out.commands.append(self._grant(lease, target, now))
            elif lease.holder is not None:
                earliest = min(earliest, lease.expires_at)
        for member_id in [m.id for m in self.members.values() if m.leaving]:
            self._finish_leave_if_done(member_id, now, out)
        if changed or out.membership_changed or self._rebalance_pending or load_due:
            out.commands.extend(self._rebalance(now, coalesce=False))
        # What this scan decided (grants, revokes, ended leaves) may set new deadlines:
        # only a scan that changed nothing may skip the next ones.
        quiet = not (changed or out.membership_changed or out.commands or out.expired)
        self._scan_at = earliest if quiet else float("-inf")  # (not _rescan: the scan itself)
        return out

    # ---- grant dispatch (the adapter persists a grant's epoch, then sends it) ------------

    def dispatched(self, tp: TopicPartition, epoch: int, member: str, now: float) -> bool:
        """The epoch of the grant (``tp``, ``epoch``) to ``member`` is durable and the grant
        is being sent now: True if it is still the lease's current grant, whose expiry then
        runs from now (a slow write does not eat into the holder's first TTL). False if the
        lease lapsed, moved on or was taken back meanwhile: the adapter must not send it
        (another grant of the partition may already be out)."""
        self._rescan()
        lease = self.leases.get(tp)
        if lease is None or lease.epoch != epoch or lease.holder != member:
            return False
        if lease.state is LeaseState.FREE:
            return False
        lease.expires_at = max(lease.expires_at, now + self.timing.expiry)
        return True

    def withheld(self, tp: TopicPartition, epoch: int, member: str) -> None:
        """The epoch of the grant (``tp``, ``epoch``) to ``member`` could not be written, so
        the grant was never sent: take it back. The partition is decided again on the next
        tick, under a newer epoch (never this one: it may yet reach the log)."""
        self._rescan()
        lease = self.leases.get(tp)
        if lease is None or lease.epoch != epoch or lease.holder != member:
            return
        self._free(lease)
        self._pend_rebalance()

    # ---- views --------------------------------------------------------------------------

    def live_members(self) -> list[MemberInfo]:
        """Members connected and serving, by id."""
        return sorted((m for m in self.members.values() if m.present), key=lambda m: m.id)

    def serving_members(self) -> list[MemberInfo]:
        """Members clients should be bound to: the live ones, plus leaving ones until they
        have released everything (clients must still be able to ack what they got)."""
        return sorted(
            (m for m in self.members.values() if m.present or (m.leaving and self.held_by(m.id))),
            key=lambda m: m.id,
        )

    def held_by(self, member_id: str) -> list[Lease]:
        return sorted(
            (lease for lease in self.leases.values() if lease.holder == member_id),
            key=lambda lease: lease.tp,
        )

    def reserved_for(self, member_id: str) -> list[TopicPartition]:
        """Free partitions kept for a member within its hold window."""
        member = self.members.get(member_id)
        if member is None or member.present:
            return []
        return sorted(
            tp
            for tp, lease in self.leases.items()
            if lease.state is LeaseState.FREE and lease.next_holder == member_id
        )

    # ---- internals ----------------------------------------------------------------------

    def _can_take(self, member_id: str) -> bool:
        member = self.members.get(member_id)
        return (
            member is not None
            and member.present
            and member.disconnected_at is None
            and member_id not in self.drained
        )

    def _revoke_reason(self, tp: TopicPartition) -> RevokeWhy:
        """Why a lease in REVOKING was revoked, for sending the revoke again."""
        if tp in self.paused:
            return RevokeWhy.RESET
        return RevokeWhy.REBALANCE if self.grants_enabled else RevokeWhy.CONFIG

    def _intended_holder(self, lease: Lease) -> str | None:
        if lease.state is LeaseState.REVOKING:
            return lease.next_holder
        if lease.state is LeaseState.FREE:
            return lease.next_holder
        return lease.holder

    def _intended_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for lease in self.leases.values():
            holder = self._intended_holder(lease)
            if holder is not None:
                counts[holder] = counts.get(holder, 0) + 1
        return counts

    def _redirect(self, lease: Lease, target: str, now: float, why: RevokeWhy) -> list[Command]:
        if lease.state is LeaseState.FREE:
            lease.next_holder = target
            return [self._grant(lease, target, now)] if self._can_take(target) else []
        lease.next_holder = target
        if lease.state is LeaseState.GRANTED:
            lease.state = LeaseState.REVOKING
            assert lease.holder is not None
            return [RevokeCmd(lease.holder, lease.tp, lease.epoch, why)]
        return []

    def _on_release(self, member_id: str, r: Released, now: float) -> list[Command]:
        lease = self.leases.get(r.tp)
        if lease is None or lease.holder != member_id or lease.epoch != r.epoch:
            return []  # stale release of an older epoch: nothing to do
        if r.committed >= 0:
            lease.committed = r.committed
        target = lease.next_holder
        self._free(lease)
        if r.tp in self.paused:
            lease.next_holder = target  # reserved for its holder; resume() grants it back
            return []
        commands: list[Command] = []
        if target is not None and self._can_take(target) and now >= self.settle_until:
            # The balancer chose the next holder when it revoked: hand it over directly.
            commands.append(self._grant(lease, target, now))
        elif target is not None and target in self.members:
            lease.next_holder = target  # reserved: its member is away within its hold window
        commands.extend(self._rebalance(now))
        return commands

    def _free(self, lease: Lease) -> None:
        lease.holder = None
        lease.state = LeaseState.FREE
        lease.next_holder = None

    def _finish_leave_if_done(self, member_id: str, now: float, out: Outcome) -> None:
        member = self.members.get(member_id)
        if member is None or not member.leaving or self.held_by(member_id):
            return
        if self.timing.hold_window > 0:
            member.leaving = False
            member.held_until = now + self.timing.hold_window
        else:
            del self.members[member_id]
            out.commands.extend(self._rebalance(now))
        out.membership_changed = True

    def _rebalance(self, now: float, *, coalesce: bool = True) -> list[Command]:
        """Run the balancer and return its commands. ``coalesce``: an event's rebalance,
        deferred to the next tick when one ran within ``Timing.rebalance_interval``; the
        tick and operator actions pass False (they run at once)."""
        if not self.grants_enabled:
            return []
        if now < self.settle_until:
            self._pend_rebalance()
            return []  # rebuilding after a restart: let holders re-attach first
        if self.timing.rebalance_interval > 0:
            work = len(self.leases) + len(self.members)
            if now - self._work_since >= self.timing.rebalance_interval:
                self._work_since, self._work = now, 0
            if coalesce and self._work and self._work + work > self.timing.rebalance_work:
                self._pend_rebalance()
                return []  # enough ran in this interval: the next tick runs one for all
            self._work += work
        self._rebalance_pending = False
        self._last_load_rebalance = now
        present = self.live_members()
        # RESERVE: members within their hold window count for the balance (their place is
        # kept); leaving members no longer do unless the hold applies to them. HANDOFF: the
        # balance is over the present members only (the others cover for the absent one).
        placeholders = [
            m
            for m in self.members.values()
            if self.timing.reserves and (m.held_until is not None or m.leaving)
        ]
        members = present + sorted(placeholders, key=lambda m: m.id)
        if not present:
            return []
        current = {
            tp: holder
            for tp, lease in self.leases.items()
            if (holder := self._intended_holder(lease)) is not None and holder in self.members
        }
        result = rebalance(
            BalanceInput(
                partitions=sorted(self.leases),
                members=[
                    Member(m.id, capacity=0 if m.id in self.drained else m.capacity, zone=m.zone)
                    for m in members
                ],
                current=current,
                strategy=self.strategy,
                weights=self.weights if self.strategy is Strategy.LOAD else {},
            )
        )
        commands: list[Command] = []
        for tp in sorted(self.leases):
            lease = self.leases[tp]
            target = result.assignment.get(tp)
            if target is None or tp in self.paused:
                continue
            if lease.state is LeaseState.FREE:
                lease.next_holder = target
                if self._can_take(target):
                    commands.append(self._grant(lease, target, now))
            elif lease.state is LeaseState.GRANTED and lease.holder != target:
                lease.state = LeaseState.REVOKING
                lease.next_holder = target
                assert lease.holder is not None
                if lease.holder in self.members:  # a lost member is simply waited out
                    commands.append(RevokeCmd(lease.holder, tp, lease.epoch, RevokeWhy.REBALANCE))
            elif lease.state is LeaseState.REVOKING:
                lease.next_holder = target
        return commands

    def _grant(
        self, lease: Lease, member_id: str, now: float, *, new_epoch: bool = True
    ) -> GrantCmd:
        if new_epoch:
            lease.epoch += 1
        lease.holder = member_id
        lease.granted_to = member_id
        lease.state = LeaseState.GRANTED
        lease.next_holder = None
        lease.expires_at = now + self.timing.expiry
        lease.kafka_fenced = False  # until the new holder's heartbeats say so
        start, lease.start = lease.start, COMMITTED
        return GrantCmd(member_id, lease.tp, lease.epoch, start)
