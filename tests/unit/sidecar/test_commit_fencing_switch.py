"""A live change of the group's ``commit_fencing`` (issue 36) on one sidecar: each lease
keeps the fencing it was granted under; the leases granted after the change take the new
one. A lease granted under ``lease`` keeps its local deadline and commits through the
commit consumer; one granted under ``kafka`` has no deadline once confirmed, its id is
initialised at the grant and it commits in its own transaction. Kafka is faked at its edge
(the consumer and the lease producers: which OffsetCommit and transactions are sent)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.kafka_fenced_commits import FencedCommitter, transactional_id
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import NO_DEADLINE, PartitionTable
from services.runtime.topic_partition import TP

GROUP = "g"
T = TP("t", 0)  # granted before the switch to kafka
U = TP("t", 1)  # granted after it
EPOCH = 3


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    def __init__(self) -> None:
        self.commits: list[list[TopicPartition]] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append(offsets)
        return offsets


class Producer:
    """A lease producer: records its initialisation and transactions."""

    def __init__(self, txn_id: str, log: list[tuple[str, str, Any]]) -> None:
        self.txn_id = txn_id
        self.log = log

    def init_transactions(self, _timeout: float) -> None:
        self.log.append(("init", self.txn_id, None))

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], _metadata: Any, _timeout: float
    ) -> None:
        self.log.append(("offsets", self.txn_id, [(o.partition, o.offset) for o in offsets]))

    def commit_transaction(self, _timeout: float) -> None:
        self.log.append(("commit", self.txn_id, None))

    def abort_transaction(self, _timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


def sidecar() -> tuple[LeaseKeeper, OffsetCommitter, Consumer, list[tuple[str, str, Any]]]:
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = Consumer()
    log: list[tuple[str, str, Any]] = []
    commits = OffsetCommitter(
        table,
        sidecar_id="s",
        fenced=FencedCommitter(GROUP, lambda i: Producer(i, log), lambda: object()),  # type: ignore[arg-type,return-value]
    )
    commits.external_changes = "ignore"
    fetcher = Fetcher(consumer, table, commits, batch=10, on_data=lambda: None)  # type: ignore[arg-type]
    keeper = LeaseKeeper(
        table, fetcher, commits, commit_interval=1, commit_max_acks=10, clock=clock
    )
    return keeper, commits, consumer, log


def test_a_switch_applies_to_the_next_grant_and_a_held_lease_keeps_its_fencing() -> None:
    keeper, commits, consumer, log = sidecar()
    table = keeper.table
    assert keeper.grant(T, EPOCH, table.clock())  # the group is lease-fenced
    keeper.kafka_fenced = True  # ConfigUpdate: commit_fencing kafka (SidecarApp._commit_fencing)
    assert keeper.grant(U, EPOCH, table.clock())
    t, u = table.get(T), table.get(U)
    assert t is not None and u is not None
    assert (t.kafka_fenced, u.kafka_fenced) == (False, True)

    # Fetching is set up: only the Kafka-fenced lease's transactional id is initialised
    # (fencing its previous holder) before the start offsets are read.
    commits.open_leases({T: 0, U: 0})
    assert log == [("init", transactional_id(GROUP, U), None)]

    # The first renewal: the lease-fenced lease gets its deadline, the other none.
    keeper.renew(T, EPOCH, table.clock() + 3)
    keeper.renew(U, EPOCH, table.clock() + 3)
    assert t.deadline == table.clock() + 3
    assert u.deadline == NO_DEADLINE
    for part in (t, u):
        part.ready = True

    # One commit round of both: T by OffsetCommit, U in its lease's transaction.
    log.clear()
    done = commits.commit([CommitRequest(T, 10, EPOCH), CommitRequest(U, 20, EPOCH)])
    assert sorted(r.tp for r in done) == [T, U]
    assert [[(o.partition, o.offset) for o in batch] for batch in consumer.commits] == [[(0, 10)]]
    assert log == [
        ("offsets", transactional_id(GROUP, U), [(1, 20)]),
        ("commit", transactional_id(GROUP, U), None),
    ]

    # Past T's deadline (no renewal): T commits no more; U, fenced at Kafka, still does.
    table.clock.now += 5  # type: ignore[attr-defined]
    log.clear()
    done = commits.commit([CommitRequest(T, 11, EPOCH), CommitRequest(U, 21, EPOCH)])
    assert [r.tp for r in done] == [U]
    assert len(consumer.commits) == 1
    assert log[0] == ("offsets", transactional_id(GROUP, U), [(1, 21)])


def test_a_switch_back_to_lease_fencing_leaves_held_kafka_leases_kafka_fenced() -> None:
    """The sidecar's side of a change away from kafka (the assigner refuses it live, but a
    re-join to an assigner whose record says otherwise, or an unset group setting meeting
    another sidecar default, reaches here): a lease granted under kafka never commits
    outside its transaction, so it cannot commit past a holder that fenced it."""
    keeper, commits, consumer, log = sidecar()
    table = keeper.table
    keeper.kafka_fenced = True
    assert keeper.grant(U, EPOCH, table.clock())
    commits.open_leases({U: 0})
    keeper.renew(U, EPOCH, table.clock() + 3)
    part = table.get(U)
    assert part is not None
    part.ready = True
    keeper.kafka_fenced = False
    assert keeper.grant(T, EPOCH, table.clock())
    assert [p.kafka_fenced for p in (table.get(T), table.get(U)) if p] == [False, True]
    log.clear()
    commits.commit([CommitRequest(U, 5, EPOCH)])
    assert consumer.commits == []
    assert log[0] == ("offsets", transactional_id(GROUP, U), [(1, 5)])


def test_a_kafka_fenced_lease_never_commits_outside_a_transaction() -> None:
    """Without lease producers (a committer built without them) a Kafka-fenced lease, which
    has no deadline, is not committed at all rather than by a plain OffsetCommit."""
    keeper, commits, consumer, _log = sidecar()
    commits.fenced = None
    table = keeper.table
    keeper.kafka_fenced = True
    assert keeper.grant(U, EPOCH, table.clock())
    keeper.renew(U, EPOCH, table.clock() + 3)
    part = table.get(U)
    assert part is not None
    part.ready = True
    assert commits.commit([CommitRequest(U, 5, EPOCH)]) == []
    assert consumer.commits == []
