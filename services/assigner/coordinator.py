"""Group coordination: members, leases with fencing epochs, cooperative handoff (pure).

One :class:`GroupCoordinator` per group. It does no I/O and reads no clock: every event
(join, heartbeat, leave, tick) passes ``now`` (monotonic seconds) and returns the commands
to send (:class:`GrantCmd`, :class:`RevokeCmd`). The RPC layer turns those into Session
messages. The rules (ARCHITECTURE §3, §3.1):

* a lease is renewed only by a heartbeat of its holder naming its current epoch, and only
  while it is ``GRANTED``; the assigner's view of its expiry is receive time + TTL + grace;
* a partition moves cooperatively: revoke -> holder releases with its committed offset ->
  grant to the next holder with epoch + 1 starting at that offset; a holder that does not
  release is waited out until its lease expires (it stops by itself before that);
* a member that misses heartbeats for TTL + grace is lost, its leases are freed and the
  partitions are balanced over the others (start offset = the group's committed offset).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from services.assigner.balancer import BalanceInput, Member, TopicPartition, rebalance

# start_offset value meaning "resume from the group's committed offset in Kafka".
COMMITTED = -1


class LeaseState(enum.Enum):
    FREE = "free"
    GRANTED = "granted"
    REVOKING = "revoking"


class RevokeWhy(enum.Enum):
    REBALANCE = "rebalance"
    MOVE = "move"
    SHUTDOWN = "shutdown"


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
    committed: int = COMMITTED  # last committed offset the holder reported
    revoked_at: float = 0.0


@dataclass
class MemberInfo:
    id: str
    endpoint: str
    session_id: str
    zone: str | None = None
    capacity: int | None = None
    last_seen: float = 0.0
    leaving: bool = False


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


@dataclass(frozen=True)
class Timing:
    ttl: float = 3.0
    grace: float = 1.0


@dataclass
class Outcome:
    """What an event produced: commands to send and whether membership changed."""

    commands: list[Command] = field(default_factory=list)
    renewed: list[HeldLease] = field(default_factory=list)
    membership_changed: bool = False
    lost: list[str] = field(default_factory=list)


class GroupCoordinator:
    def __init__(
        self, group: str, partitions: Iterable[TopicPartition], timing: Timing | None = None
    ) -> None:
        self.group = group
        self.timing = timing or Timing()
        self.members: dict[str, MemberInfo] = {}
        self.leases: dict[TopicPartition, Lease] = {}
        self.set_partitions(partitions)

    # ---- inputs -------------------------------------------------------------------------

    def set_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.leases.setdefault(tp, Lease(tp))

    def join(self, member: MemberInfo, held: Sequence[HeldLease], now: float) -> Outcome:
        """A sidecar (re-)attached. Leases it still holds with the current epoch stay put."""
        out = Outcome(membership_changed=member.id not in self.members)
        member.last_seen = now
        self.members[member.id] = member
        for h in held:
            lease = self.leases.get(h.tp)
            if (
                lease
                and lease.holder == member.id
                and lease.epoch == h.epoch
                and lease.state is LeaseState.GRANTED
            ):
                lease.expires_at = now + self.timing.ttl + self.timing.grace
                out.renewed.append(h)
        # A revoke sent on the broken stream may have been lost: send it again.
        for lease in self.held_by(member.id):
            if lease.state is LeaseState.REVOKING:
                out.commands.append(
                    RevokeCmd(member.id, lease.tp, lease.epoch, RevokeWhy.REBALANCE)
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
        for r in released:
            out.commands.extend(self._on_release(member_id, r, now))
        if released:
            self._drop_member_if_done(member_id, out)
        for p in progress:
            lease = self.leases.get(p.tp)
            if (
                lease is not None
                and lease.holder == member_id
                and lease.epoch == p.epoch
                and lease.state is LeaseState.GRANTED
            ):
                lease.expires_at = now + self.timing.ttl + self.timing.grace
                if p.committed >= 0:
                    lease.committed = p.committed
                out.renewed.append(HeldLease(p.tp, p.epoch))
        return out

    def leave(self, member_id: str, now: float) -> Outcome:
        """Graceful leave: revoke everything the member holds; it stays until released."""
        member = self.members.get(member_id)
        out = Outcome()
        if member is None or member.leaving:
            return out
        member.leaving = True
        out.membership_changed = True
        out.commands.extend(self._rebalance(now, shutdown=member_id))
        self._drop_member_if_done(member_id, out)
        return out

    def disconnect_expired(self, now: float) -> Outcome:
        """Tick: expire silent members and unreleased leases, finish pending handoffs."""
        out = Outcome()
        deadline = self.timing.ttl + self.timing.grace
        for member in list(self.members.values()):
            if now - member.last_seen > deadline:
                del self.members[member.id]
                out.lost.append(member.id)
                out.membership_changed = True
        for lease in self.leases.values():
            # A lease lapses at its own expiry, never earlier: even when its member was just
            # declared lost, a lease granted or renewed recently may still be valid on the
            # sidecar's side. Nobody renewing it (member gone, grant lost with a broken
            # stream, a holder ignoring a revoke) means it lapses, and the holder stopped
            # by itself before this moment.
            if lease.holder is not None and now > lease.expires_at:
                # The holder may have committed past its last report: the next owner
                # resumes from what Kafka has, not from our copy.
                lease.committed = COMMITTED
                self._free(lease)
        for member_id in [m.id for m in self.members.values() if m.leaving]:
            self._drop_member_if_done(member_id, out)
        out.commands.extend(self._rebalance(now))
        return out

    # ---- views --------------------------------------------------------------------------

    def live_members(self) -> list[MemberInfo]:
        return sorted((m for m in self.members.values() if not m.leaving), key=lambda m: m.id)

    def held_by(self, member_id: str) -> list[Lease]:
        return sorted(
            (lease for lease in self.leases.values() if lease.holder == member_id),
            key=lambda lease: lease.tp,
        )

    # ---- internals ----------------------------------------------------------------------

    def _on_release(self, member_id: str, r: Released, now: float) -> list[Command]:
        lease = self.leases.get(r.tp)
        if lease is None or lease.holder != member_id or lease.epoch != r.epoch:
            return []  # stale release of an older epoch: nothing to do
        if r.committed >= 0:
            lease.committed = r.committed
        self._free(lease)
        return self._rebalance(now)

    def _free(self, lease: Lease) -> None:
        lease.holder = None
        lease.state = LeaseState.FREE
        lease.next_holder = None

    def _drop_member_if_done(self, member_id: str, out: Outcome) -> None:
        member = self.members.get(member_id)
        if member and member.leaving and not self.held_by(member_id):
            del self.members[member_id]
            out.membership_changed = True

    def _rebalance(self, now: float, shutdown: str | None = None) -> list[Command]:
        live = self.live_members()
        if not live:
            return []
        current = {
            tp: (lease.next_holder if lease.state is LeaseState.REVOKING else lease.holder)
            for tp, lease in self.leases.items()
            if lease.holder is not None
        }
        result = rebalance(
            BalanceInput(
                partitions=sorted(self.leases),
                members=[Member(m.id, capacity=m.capacity, zone=m.zone) for m in live],
                current={tp: h for tp, h in current.items() if h is not None},
            )
        )
        commands: list[Command] = []
        for tp in sorted(self.leases):
            lease = self.leases[tp]
            target = result.assignment.get(tp)
            if lease.state is LeaseState.FREE:
                if target is not None:
                    commands.append(self._grant(lease, target, now))
            elif lease.holder != target or lease.holder == shutdown:
                if lease.state is LeaseState.GRANTED:
                    lease.state = LeaseState.REVOKING
                    lease.revoked_at = now
                    why = RevokeWhy.SHUTDOWN if lease.holder == shutdown else RevokeWhy.REBALANCE
                    assert lease.holder is not None
                    if lease.holder in self.members:  # a lost member is simply waited out
                        commands.append(RevokeCmd(lease.holder, tp, lease.epoch, why))
                lease.next_holder = target
            elif lease.state is LeaseState.REVOKING and lease.holder == target:
                lease.next_holder = target  # it stays; the holder still releases first
        return commands

    def _grant(self, lease: Lease, member_id: str, now: float) -> GrantCmd:
        lease.epoch += 1
        lease.holder = member_id
        lease.state = LeaseState.GRANTED
        lease.next_holder = None
        lease.expires_at = now + self.timing.ttl + self.timing.grace
        return GrantCmd(member_id, lease.tp, lease.epoch, lease.committed)
