"""The fencing argument of ``commit_fencing: kafka`` (issue 36) in the Session protocol model
of :mod:`tests.unit.assigner.test_fencing_model` (the real coordinator, messages that take
time and get lost, paused sidecars), with Kafka's transactional ids modelled too.

In this mode a lease has no local deadline: once a heartbeat ack confirms it, it lasts
until a revoke, a fence, or Kafka refusing its commit. So two sidecars *can* hold the same
partition at once (a paused one, a cut-off one): the one-holder property of lease mode
does not hold, by design. What must hold is the property it was for: **no commit lands
behind the next holder** — the group's committed offset of a partition never goes back.

Kafka, as checked against the broker (``tests/integration/test_fenced_commits.py``): each
partition's ``transactional.id`` has a producer epoch; ``init_transactions`` bumps it; a
commit succeeds only from the producer with the current epoch. Each sidecar initialises
a lease's id when the grant arrives, then reads the committed offset and starts there;
every commit round of a live lease commits one record further; a refused commit ends the
lease there (dropped, reported released).

``LAZY_INIT`` is the tempting shortcut (read the start offset at the grant, create the
producer at the first commit): the model finds the committed offset going back under it,
which is why the producer must be initialised before the start offset is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from services.assigner.coordinator import GrantCmd, GroupCoordinator, Released, RevokeCmd, RevokeWhy
from services.runtime.topic_partition import TopicPartition
from tests.support.fencing_model import (
    MEMBERS,
    MODEL,
    NEW_RULES,
    TICK,
    TIMING,
    TPS,
    Ack,
    Assigner,
    Interval,
    Sidecar,
    World,
    operation,
)

COMMIT_EVERY = 0.5


class CommitBehind(AssertionError):
    pass


@dataclass
class Kafka:
    """Per partition: the transactional id's producer epoch and the committed offset; the
    history of successful commits (time, partition, offset, member)."""

    producer_epoch: dict[TopicPartition, int] = field(default_factory=dict)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    history: list[tuple[float, TopicPartition, int, str]] = field(default_factory=list)

    def init_transactions(self, tp: TopicPartition) -> int:
        self.producer_epoch[tp] = self.producer_epoch.get(tp, 0) + 1
        return self.producer_epoch[tp]

    def commit(self, tp: TopicPartition, epoch: int, offset: int, member: str, now: float) -> bool:
        if epoch != self.producer_epoch.get(tp):
            return False  # _FENCED: a newer producer initialised the id
        self.committed[tp] = offset
        self.history.append((now, tp, offset, member))
        return True


@dataclass
class KafkaFencedSidecar(Sidecar):
    kafka: Kafka = field(default_factory=Kafka)
    lazy_init: bool = False
    reports_kafka_fenced: bool = True  # its leases move at once when its session ends
    # tp -> (lease epoch, producer epoch or None before a lazy init, next offset to commit)
    producers: dict[TopicPartition, tuple[int, int | None, int]] = field(default_factory=dict)

    def receive(self, message: object) -> None:
        if self.paused:
            self.inbox.append(message)
            return
        if isinstance(message, RevokeCmd) and message.reason is not RevokeWhy.FENCED:
            current = self.held.get(message.tp)
            if current is not None and current.epoch == message.epoch:
                self._commit(message.tp)  # a handoff commits what was acked first
        before = {tp: lease.epoch for tp, lease in self.held.items()}
        super().receive(message)
        if isinstance(message, GrantCmd):
            lease = self.held.get(message.tp)
            if lease is not None and before.get(message.tp) != lease.epoch:
                self._open(message.tp, lease.epoch)
        for tp in [tp for tp in self.producers if tp not in self.held]:
            del self.producers[tp]

    def _open(self, tp: TopicPartition, epoch: int) -> None:
        """A grant: initialise the id (fencing the previous holder), then read the start."""
        producer = None if self.lazy_init else self.kafka.init_transactions(tp)
        self.producers[tp] = (epoch, producer, self.kafka.committed.get(tp, 0))

    def _acked(self, ack: Ack, now: float) -> None:
        super()._acked(ack, now)
        for lease in self.held.values():
            if lease.live_from is not None:
                lease.deadline = float("inf")  # no local deadline: fenced at Kafka instead

    def _commit(self, tp: TopicPartition) -> None:
        lease = self.held.get(tp)
        entry = self.producers.get(tp)
        if lease is None or entry is None or lease.live_from is None or entry[0] != lease.epoch:
            return
        epoch, producer, position = entry
        if producer is None:
            producer = self.kafka.init_transactions(tp)  # LAZY_INIT: at the first commit
        if self.kafka.commit(tp, producer, position + 1, self.id, self.world.now):
            self.producers[tp] = (epoch, producer, position + 1)
        else:
            self._end(tp, self.world.now)  # fenced at Kafka: the lease is over here
            del self.producers[tp]
            self.releases.append(Released(tp, epoch, -1))

    def commit_round(self) -> None:
        """The commit loop: every COMMIT_EVERY seconds, each live lease one record further
        (a paused process commits nothing until it resumes)."""
        if not self.paused:
            for tp in sorted(self.held):
                self._commit(tp)
        self.world.at(self.world.now + COMMIT_EVERY, self.commit_round)


def run_kafka_history(lazy_init: bool, data: st.DataObject) -> Kafka:
    world = World(data.draw)
    kafka = Kafka()
    intervals: list[Interval] = []
    assigner = Assigner(world, NEW_RULES, GroupCoordinator("g", TPS, TIMING))
    sides = {
        m: KafkaFencedSidecar(m, world, NEW_RULES, intervals, kafka=kafka, lazy_init=lazy_init)
        for m in MEMBERS
    }
    for side in sides.values():
        world.at(0.0, side.beat)
        world.at(0.0, side.commit_round)
    world.at(0.0, assigner.tick)
    for op, member, step in data.draw(st.lists(operation, min_size=1, max_size=25)):
        world.run_until(world.now + step)
        side = sides[member]
        if op == "join" and not side.paused:
            assigner.join(side)
        elif op == "pause":
            side.paused = True
        elif op == "resume" and side.paused:
            side.resume()
        elif op == "cut":
            assigner.cut(side)
    for side in sides.values():
        if side.paused:
            side.resume()  # every zombie wakes up and tries
    world.run_until(world.now + 15.0 + TICK)
    return kafka


def check_never_behind(kafka: Kafka) -> None:
    last: dict[TopicPartition, tuple[int, str, float]] = {}
    for at, tp, offset, member in kafka.history:
        previous = last.get(tp)
        if previous is not None and offset < previous[0]:
            raise CommitBehind(
                f"{tp}: {member} committed {offset} at {at:.2f} behind {previous[1]}'s "
                f"{previous[0]} at {previous[2]:.2f}"
            )
        last[tp] = (offset, member, at)


@settings(MODEL, max_examples=300)
@given(st.data())
def test_no_commit_lands_behind_the_next_holder_with_delays_loss_and_pauses(
    data: st.DataObject,
) -> None:
    check_never_behind(run_kafka_history(False, data))


def test_the_model_finds_commits_behind_with_a_lazily_created_producer() -> None:
    @settings(MODEL, max_examples=2000, derandomize=True, database=None, phases=[Phase.generate])
    @given(st.data())
    def history(data: st.DataObject) -> None:
        check_never_behind(run_kafka_history(True, data))

    with pytest.raises(CommitBehind):
        history()
