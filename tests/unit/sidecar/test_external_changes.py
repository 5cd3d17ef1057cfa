"""The committer's check for commits it did not make, per the group's external_offset_changes
(issue 23): follow flags the partition and commits it no more; revert commits the holder's
position over it and keeps it for the audit report; ignore never reads the offsets back; a
commit reads back only partitions not read back within the check interval.
The consumer is a stand-in (pure logic: which OffsetFetch and OffsetCommit are sent)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import CommitRequest, OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable, Reverted
from services.runtime import commitmeta
from services.runtime.topic_partition import TP

T = TP("t", 0)
U = TP("t", 1)
EPOCH = 4


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class Consumer:
    """OffsetFetch answers each partition's last commit here; counts the OffsetFetches."""

    def __init__(self) -> None:
        self.commits: list[list[TopicPartition]] = []
        self.fetches = 0

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append(offsets)
        return offsets

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.fetches += 1
        last = {(tp.topic, tp.partition): tp for batch in self.commits for tp in batch}
        return [
            last.get((tp.topic, tp.partition), TopicPartition(tp.topic, tp.partition, -1001))
            for tp in partitions
        ]

    def external(self, tp: TP, offset: int) -> None:
        """kafka-consumer-groups --reset-offsets: a commit with no metadata."""
        self.commits.append([TopicPartition(tp.topic, tp.partition, offset)])


def held(mode: str) -> tuple[OffsetCommitter, Consumer, PartitionTable]:
    clock = Clock()
    table = PartitionTable(1 << 26, clock)
    consumer = Consumer()
    commits = OffsetCommitter(table, sidecar_id="s")
    Fetcher(consumer, table, commits, batch=10, on_data=lambda: None)  # type: ignore[arg-type]
    commits.external_changes = mode
    for tp in (T, U):
        table.add(Partition(tp=tp, epoch=EPOCH, deadline=clock.now + 30, acks=PartitionAcks(0)))
    commits.commit([CommitRequest(T, 100, EPOCH), CommitRequest(U, 200, EPOCH)])
    for tp, offset in ((T, 100), (U, 200)):
        part = table.get(tp)
        assert part is not None
        part.committed = offset
    return commits, consumer, table


def take_reverted(table: PartitionTable) -> list[Reverted]:
    """What the next heartbeat reports (LeaseCommitter.take_reverted), taken."""
    taken: list[Reverted] = []
    for part in table.snapshot():
        taken += part.reverted
        part.reverted = []
    return taken


def last_commit(consumer: Consumer, tp: TP) -> tuple[int, commitmeta.CommitMetadata | None]:
    found = consumer.committed([TopicPartition(tp.topic, tp.partition)], 1)[0]
    return found.offset, commitmeta.decode(found.metadata, found.offset)


def test_follow_flags_the_partition_and_commits_it_no_more() -> None:
    commits, consumer, table = held("follow")
    consumer.external(T, 0)
    assert commits.check_external([T, U]) == [T]
    part = table.get(T)
    assert part is not None and part.external == (0, "")
    assert commits.commit([CommitRequest(T, 150, EPOCH), CommitRequest(U, 250, EPOCH)]) == [
        CommitRequest(U, 250, EPOCH)
    ]
    assert last_commit(consumer, T)[0] == 0, "the external commit stays for the assigner"
    assert take_reverted(table) == []


def test_revert_commits_the_holders_position_over_it_at_once() -> None:
    commits, consumer, table = held("revert")
    consumer.external(T, 0)
    assert commits.check_external([T, U]) == [T]
    offset, meta = last_commit(consumer, T)
    assert offset == 100 and meta is not None and (meta.epoch, meta.sidecar) == (EPOCH, "s")
    part = table.get(T)
    assert part is not None and part.external is None, "nothing to follow: fetching goes on"
    [reverted] = take_reverted(table)
    assert (reverted.tp, reverted.epoch, reverted.restored, reverted.external) == (
        T,
        EPOCH,
        100,
        0,
    )
    assert take_reverted(table) == [], "reported once"
    assert commits.check_external([T, U]) == [], "its own commit is not external"


def test_revert_before_a_commit_lets_that_commit_be_the_revert() -> None:
    commits, consumer, table = held("revert")
    commits.external_check_seconds = 0.0  # read back before every commit
    consumer.external(U, 50)
    sent = len(consumer.commits)
    request = CommitRequest(U, 230, EPOCH)
    assert commits.commit([request]) == [request]
    assert len(consumer.commits) == sent + 1, "one commit: the one asked for"
    assert last_commit(consumer, U)[0] == 230
    [reverted] = take_reverted(table)
    assert (reverted.tp, reverted.restored, reverted.external) == (U, 230, 50)


def test_revert_with_no_position_of_its_own_follows() -> None:
    commits, consumer, table = held("revert")
    part = table.get(T)
    assert part is not None
    part.committed = -1  # started where Kafka had nothing, committed nothing yet
    consumer.external(T, 7)
    assert commits.check_external([T]) == [T]
    assert part.external == (7, "") and take_reverted(table) == []


def test_ignore_never_reads_the_offsets_back_before_a_commit() -> None:
    commits, consumer, _ = held("ignore")
    consumer.external(T, 0)
    fetches = consumer.fetches
    request = CommitRequest(T, 150, EPOCH)
    assert commits.commit([request]) == [request]
    assert consumer.fetches == fetches
    assert last_commit(consumer, T)[0] == 150, "overwritten, as the group asked"


def test_a_commit_reads_back_only_what_was_not_read_back_within_the_interval() -> None:
    """The OffsetFetch before a commit is on the ack's path: at most once per interval
    per partition, whoever read it back last (the check loop or an earlier commit)."""
    commits, consumer, _ = held("follow")
    commits.external_check_seconds = 60.0
    fetches = consumer.fetches  # held() committed once: T and U were read back then
    commits.commit([CommitRequest(T, 120, EPOCH), CommitRequest(U, 220, EPOCH)])
    assert consumer.fetches == fetches
    commits.external_check_seconds = 0.0
    commits.commit([CommitRequest(T, 130, EPOCH)])
    assert consumer.fetches == fetches + 1
