"""Backpressure on the fetch thread, without Kafka: when the sidecar holds consume() back,
when it pauses partitions, and when it resumes them (fetcher._holding, _apply_backpressure).

pause() makes librdkafka drop what it prefetched, and a resumed partition delivered again
only after 300+ ms, so in leased mode a full buffer first holds consumption back; only a
buffer full for longer than HOLD_SECONDS pauses partitions (so that consume() serves
statistics and errors again). kafka_group mode pauses at once: it must keep polling."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from dataservice.common.v1 import common_pb2
from dsclient.records.batches import chunk_from_records
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.backpressure_watch import backpressured
from services.consumer_sidecar.fetch_backpressure import HOLD_SECONDS
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.runtime.topic_partition import TP

TOPIC = "t"
RECORD = 1000  # value bytes per record


class PausingConsumer:
    def __init__(self) -> None:
        self.paused: set[int] = set()

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in partitions}


def setup(
    partitions: int, cap: int, prefetch: int = 0
) -> tuple[PartitionTable, Fetcher, PausingConsumer]:
    table = PartitionTable(cap, time.monotonic)
    consumer = PausingConsumer()
    fetcher = Fetcher(
        consumer,  # type: ignore[arg-type]
        table,
        OffsetCommitter(table, sidecar_id="s"),
        batch=100,
        on_data=lambda: None,
        prefetch_bytes=prefetch,
    )
    for p in range(partitions):
        part = Partition(
            tp=TP(TOPIC, p), epoch=1, deadline=time.monotonic() + 60, acks=PartitionAcks(0)
        )
        part.ready = True
        part.position = 0
        table.add(part)
    return table, fetcher, consumer


def fill(table: PartitionTable, partition: int, records: int) -> None:
    part = table.partitions[TP(TOPIC, partition)]
    start = part.position
    chunk = chunk_from_records(
        [
            common_pb2.Record(topic=TOPIC, partition=partition, offset=o, value=b"x" * RECORD)
            for o in range(start, start + records)
        ]
    )
    assert table.append(TP(TOPIC, partition), chunk)


def test_a_full_buffer_holds_consumption_back_without_pausing() -> None:
    table, fetcher, consumer = setup(partitions=4, cap=40 * 1024)
    for p in range(4):
        fill(table, p, 10)  # about 11 KB each, 44 KB in all: over the 40 KB cap
    assert table.buffered_bytes >= table.buffer_max_bytes
    assert fetcher._holding()
    assert table.holding  # reported as backpressure
    fetcher._apply_backpressure()
    assert consumer.paused == set()  # nothing prefetched is thrown away


def test_delivery_ends_the_hold_and_wakes_the_loop() -> None:
    table, fetcher, _ = setup(partitions=2, cap=20 * 1024)
    fill(table, 0, 10)
    fill(table, 1, 10)
    assert fetcher._holding()
    fetcher._wake.clear()
    assert table.take(5, 1 << 20)
    assert fetcher._wake.is_set()  # the loop goes on consuming at once
    assert not fetcher._holding()
    assert not table.holding


def test_full_for_longer_than_the_hold_pauses_every_partition_then_resumes() -> None:
    table, fetcher, consumer = setup(partitions=2, cap=20 * 1024)
    fill(table, 0, 10)
    fill(table, 1, 10)
    assert fetcher._holding()
    assert fetcher._full_since is not None
    fetcher._full_since -= HOLD_SECONDS + 0.1  # the application has not read for a while
    fetcher.last_poll = time.monotonic()
    assert not fetcher._holding()  # consume() runs again, to serve statistics and errors
    fetcher._apply_backpressure()
    assert consumer.paused == {0, 1}
    while table.buffered_bytes > 0:  # the application catches up
        table.take(100, 1 << 20)
    assert not fetcher._holding()
    fetcher._apply_backpressure()
    assert consumer.paused == set()


def test_leased_partition_cap_is_twice_its_fair_share() -> None:
    # One partition's backlog may not crowd the others out of the buffer.
    table, fetcher, consumer = setup(partitions=4, cap=400 * 1024)
    fill(table, 0, 200)  # ~219 KB: over 2 x 102 KB, under the total cap
    fill(table, 1, 60)  # ~66 KB: under twice its share
    assert not fetcher._holding()
    fetcher._apply_backpressure()
    assert consumer.paused == {0}


def test_kafka_group_mode_pauses_at_once_and_never_holds() -> None:
    table, fetcher, consumer = setup(partitions=2, cap=20 * 1024)
    fetcher.classic = True
    fill(table, 0, 10)
    fill(table, 1, 10)
    assert not fetcher._holding()  # it must keep polling (max.poll.interval.ms)
    fetcher._apply_backpressure()
    assert consumer.paused == {0, 1}


def test_holding_starts_below_the_cap_by_what_librdkafka_may_prefetch() -> None:
    # Held back, librdkafka keeps up to queued.max.messages.kbytes prefetched: the buffer
    # and that queue together stay within the cap.
    table, fetcher, _ = setup(partitions=1, cap=100 * 1024, prefetch=30 * 1024)
    assert table.hold_at == 70 * 1024
    fill(table, 0, 60)  # ~64 KB: under hold_at
    assert not fetcher._holding()
    fill(table, 0, 10)  # ~75 KB: past hold_at, still under the cap
    assert fetcher._holding()


def test_client_backpressure_names_held_back_and_paused_partitions_not_suspended() -> None:
    # What the CLIENT_BACKPRESSURE watcher reports, over the states the fetcher sets.
    table, fetcher, consumer = setup(partitions=4, cap=400 * 1024)
    assert backpressured(table) == []
    fill(table, 0, 200)  # ~219 KB, over twice its fair share: paused
    assert not fetcher._holding()
    fetcher._apply_backpressure()
    assert consumer.paused == {0} and backpressured(table) == [TP(TOPIC, 0)]
    fill(table, 1, 200)  # the whole buffer full: consumption held back for every partition
    assert fetcher._holding() and table.holding
    assert sorted(backpressured(table)) == [TP(TOPIC, p) for p in range(4)]
    # A suspended lease is paused for fencing, not because clients are slow.
    table.partitions[TP(TOPIC, 3)].suspended_at = time.monotonic()
    assert sorted(backpressured(table)) == [TP(TOPIC, p) for p in range(3)]
