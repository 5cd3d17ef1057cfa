"""The fencing model the state-writer unit tests share: the assigners, sidecars and world they
race in, the operations and the rules a run is checked against."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from services.assigner.coordinator import (
    GrantCmd,
    GroupCoordinator,
    HeldLease,
    MemberInfo,
    Outcome,
    Progress,
    Released,
    RevokeCmd,
    RevokeWhy,
    Timing,
)
from services.runtime.topic_partition import TopicPartition

TTL, GRACE, MARGIN, HEARTBEAT, TICK = 3.0, 1.0, 0.5, 1.0, 0.25


TIMING = Timing(ttl=TTL, grace=GRACE, hold_window=0.0)


WRITE_TIMEOUT = 5.0


TPS = [TopicPartition("t", p) for p in range(3)]


MEMBERS = ["a", "b", "c"]


# Drawn per write and per message: most are quick, some slower than TTL + grace.
WRITE_DELAYS = st.sampled_from([0.0] * 3 + [0.02] * 2 + [0.5, 4.5, 9.0])


NET_DELAYS = st.sampled_from([0.0] * 4 + [0.01] * 3 + [0.3, 2.0, 6.0])


LOST = st.sampled_from([False] * 15 + [True])


Interval = tuple[str, TopicPartition, int, float, float]  # member, tp, epoch, from, to


@dataclass(frozen=True)
class Rules:
    live_from_ack: bool  # sidecar: a grant is live only once a later heartbeat is acked
    dispatch_checks: bool  # assigner: expiry from dispatch; stale or failed grants not sent
    write_timeout: float | None  # assigner: a write slower than this fails


NEW_RULES = Rules(live_from_ack=True, dispatch_checks=True, write_timeout=WRITE_TIMEOUT)


@dataclass(frozen=True)
class Heartbeat:
    member: str
    seq: int
    progress: list[Progress]
    released: list[Released]


@dataclass(frozen=True)
class Ack:
    seq: int
    renewed: frozenset[tuple[TopicPartition, int]]


@dataclass
class World:
    draw: Callable[[st.SearchStrategy[object]], object]
    now: float = 0.0
    _queue: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._order), action))

    def run_until(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            when, _, action = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            action()
        self.now = max(self.now, until)


@dataclass
class Stream:
    """One direction of one Session stream: in order, each message after a drawn delay,
    or lost. Closed streams deliver nothing more."""

    world: World
    deliver: Callable[[object], None]
    open: bool = True
    _last: float = 0.0

    def send(self, message: object) -> None:
        if not self.open or self.world.draw(LOST):
            return
        delay = float(self.world.draw(NET_DELAYS))  # type: ignore[arg-type]
        self._last = max(self._last, self.world.now + delay)
        self.world.at(self._last, lambda: self.deliver(message) if self.open else None)


@dataclass
class SideLease:
    epoch: int
    received_at: float
    live_from: float | None = None
    deadline: float = float("-inf")


@dataclass
class Sidecar:
    id: str
    world: World
    rules: Rules
    intervals: list[Interval]
    held: dict[TopicPartition, SideLease] = field(default_factory=dict)
    releases: list[Released] = field(default_factory=list)
    sent: dict[int, tuple[float, frozenset[tuple[TopicPartition, int]]]] = field(
        default_factory=dict
    )  # seq -> (send time, the leases it named)
    seq: int = 0
    up: Stream | None = None
    paused: bool = False
    inbox: list[object] = field(default_factory=list)  # reached it while paused
    # Its heartbeats report its leases' commits fenced at Kafka (LeaseProgress.fenced_by_kafka).
    reports_kafka_fenced: bool = False

    def _end(self, tp: TopicPartition, at: float) -> None:
        lease = self.held.pop(tp)
        self._record(tp, lease, min(lease.deadline, at))

    def _record(self, tp: TopicPartition, lease: SideLease, end: float) -> None:
        if lease.live_from is not None and end > lease.live_from:
            self.intervals.append((self.id, tp, lease.epoch, lease.live_from, end))

    def receive(self, message: object) -> None:
        if self.paused:
            self.inbox.append(message)
            return
        now = self.world.now
        if isinstance(message, GrantCmd):
            current = self.held.get(message.tp)
            if current is not None and current.epoch >= message.epoch:
                return
            if current is not None:
                self._end(message.tp, now)
            lease = SideLease(message.epoch, now)
            if not self.rules.live_from_ack:
                lease.live_from, lease.deadline = now, now + TTL - MARGIN
            self.held[message.tp] = lease
            self.heartbeat()
        elif isinstance(message, RevokeCmd):
            current = self.held.get(message.tp)
            fenced = message.reason is RevokeWhy.FENCED
            dropped = current is not None and (
                current.epoch <= message.epoch if fenced else current.epoch == message.epoch
            )
            if dropped:
                self._end(message.tp, now)
            committed = 0 if dropped and not fenced else -1
            self.releases.append(Released(message.tp, message.epoch, committed))
            self.heartbeat()
        else:
            assert isinstance(message, Ack)
            self._acked(message, now)

    def _acked(self, ack: Ack, now: float) -> None:
        if ack.seq not in self.sent:
            return
        sent, named = self.sent.pop(ack.seq)
        for tp, lease in list(self.held.items()):
            if (tp, lease.epoch) in ack.renewed:
                if lease.live_from is not None and lease.deadline <= now:
                    # Expired meanwhile, resumed now: close the interval it was live.
                    self._record(tp, lease, lease.deadline)
                    lease.live_from = None
                lease.deadline = max(lease.deadline, sent + TTL - MARGIN)
                if lease.live_from is None and now < lease.deadline:
                    lease.live_from = now
            elif (tp, lease.epoch) in named and (lease.live_from is None or lease.deadline <= sent):
                self._end(tp, now)  # named, not renewed: the assigner does not count it

    def heartbeat(self) -> None:
        if self.up is None or self.paused:
            return
        self.seq += 1
        progress = [
            Progress(tp, lease.epoch, kafka_fenced=self.reports_kafka_fenced)
            for tp, lease in sorted(self.held.items())
        ]
        self.sent[self.seq] = (self.world.now, frozenset((p.tp, p.epoch) for p in progress))
        released, self.releases = self.releases, []
        self.up.send(Heartbeat(self.id, self.seq, progress, released))

    def beat(self) -> None:
        """The heartbeat loop: every HEARTBEAT seconds, for the life of the process."""
        self.heartbeat()
        self.world.at(self.world.now + HEARTBEAT, self.beat)

    def resume(self) -> None:
        self.paused = False
        inbox, self.inbox = self.inbox, []
        for message in inbox:
            self.receive(message)

    def finish(self) -> None:
        for tp in list(self.held):
            self._end(tp, float("inf"))


@dataclass
class Pipeline:
    """A member's outgoing messages in order; a grant holds back what follows it until
    its epoch is written (acks bypass it: they never concern a grant not yet sent)."""

    down: Stream
    entries: list[list[object]] = field(default_factory=list)  # [ready, message]

    def push(self, message: object, ready: bool) -> list[object]:
        entry: list[object] = [ready, message]
        self.entries.append(entry)
        self.flush()
        return entry

    def flush(self) -> None:
        while self.entries:
            ready, message = self.entries[0]
            if ready is False:
                return  # its epoch is still being written
            self.entries.pop(0)
            if ready is True:
                self.down.send(message)  # (None: withheld or stale, never sent)


@dataclass
class Assigner:
    world: World
    rules: Rules
    coordinator: GroupCoordinator = field(
        default_factory=lambda: GroupCoordinator("g", TPS, TIMING)
    )
    pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def apply(self, out: Outcome) -> None:
        for cmd in out.commands:
            pipeline = self.pipelines.get(cmd.member)
            if pipeline is None:
                continue  # no stream: re-derived on re-join, or the lease lapses
            if isinstance(cmd, GrantCmd):
                self._grant(cmd, pipeline)
            else:
                pipeline.push(cmd, ready=True)

    def _grant(self, cmd: GrantCmd, pipeline: Pipeline) -> None:
        entry = pipeline.push(cmd, ready=False)
        delay = float(self.world.draw(WRITE_DELAYS))  # type: ignore[arg-type]
        timeout = self.rules.write_timeout
        if timeout is not None and delay > timeout:
            self.world.at(self.world.now + timeout, lambda: self._withheld(cmd, entry, pipeline))
        else:
            self.world.at(self.world.now + delay, lambda: self._written(cmd, entry, pipeline))

    def _written(self, cmd: GrantCmd, entry: list[object], pipeline: Pipeline) -> None:
        send = True
        if self.rules.dispatch_checks:
            send = self.coordinator.dispatched(cmd.tp, cmd.epoch, cmd.member, self.world.now)
        entry[0] = True if send else None
        pipeline.flush()

    def _withheld(self, cmd: GrantCmd, entry: list[object], pipeline: Pipeline) -> None:
        self.coordinator.withheld(cmd.tp, cmd.epoch, cmd.member)
        entry[0] = None
        pipeline.flush()

    def join(self, side: Sidecar) -> None:
        """The sidecar (re-)opens its Session: new streams, the old ones' messages gone."""
        old = self.pipelines.get(side.id)
        if old is not None:
            old.down.open = False
        if side.up is not None:
            side.up.open = False
        side.up = Stream(self.world, self.receive)
        self.pipelines[side.id] = Pipeline(Stream(self.world, side.receive))
        held = [HeldLease(tp, lease.epoch) for tp, lease in sorted(side.held.items())]
        member = MemberInfo(id=side.id, endpoint=f"{side.id}:1", session_id=f"s-{side.id}")
        self.apply(self.coordinator.join(member, held, self.world.now))
        side.heartbeat()

    def cut(self, side: Sidecar) -> None:
        """The sidecar's side ends its Session (a broken connection, a killed process's
        socket): both streams close, the process lives on with what it holds (the worst
        case: a zombie), and the assigner is told the stream ended."""
        pipeline = self.pipelines.pop(side.id, None)
        if pipeline is None:
            return
        pipeline.down.open = False
        if side.up is not None:
            side.up.open = False
        side.up = None
        self.apply(self.coordinator.disconnected(side.id, self.world.now))

    def receive(self, message: object) -> None:
        assert isinstance(message, Heartbeat)
        out = self.coordinator.heartbeat(
            message.member, message.progress, message.released, self.world.now
        )
        pipeline = self.pipelines.get(message.member)
        if pipeline is not None and message.member in self.coordinator.members:
            renewed = frozenset((h.tp, h.epoch) for h in out.renewed)
            pipeline.down.send(Ack(message.seq, renewed))
        self.apply(out)

    def tick(self) -> None:
        out = self.coordinator.disconnect_expired(self.world.now)
        for lost in out.lost + out.disconnected:
            pipeline = self.pipelines.pop(lost, None)
            if pipeline is not None:
                pipeline.down.open = False
        self.apply(out)
        self.world.at(self.world.now + TICK, self.tick)


operation = st.tuples(
    st.sampled_from(["join", "join", "pause", "resume", "cut", "wait"]),
    st.sampled_from(MEMBERS),
    st.sampled_from([0.0, 0.3, 1.0, 2.5, 5.0]),
)


MODEL = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
