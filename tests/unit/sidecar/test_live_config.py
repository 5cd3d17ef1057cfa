"""The group's consumer config applied live, without Kafka.

:class:`LiveConfig` (which offer runs, when a consumer is replaced, what is refused and
reported) with a replacement callback that records what it was asked; and
:meth:`Fetcher.replace_consumer` (which partitions the new consumer takes over, from which
offset, paused or not) with a consumer class that records its calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from services.consumer_sidecar import fetcher as fetcher_module
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.fetcher import Fetcher
from services.consumer_sidecar.live_config import LiveConfig, Rejection
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.runtime.topic_partition import TP

REFUSAL = "`fetch.max.bytes` must be >= `message.max.bytes`"


class Replacer:
    """Records every replacement asked for; refuses configs with ``refuse`` in a value;
    holds a replacement until ``release`` is set, when ``hold`` is."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []
        self.hold = False
        self.release = asyncio.Event()

    async def __call__(self, group: dict[str, str]) -> None:
        self.calls.append(group)
        if self.hold:
            await self.release.wait()
        if "refuse" in group.values():
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, f"Failed to create consumer: {REFUSAL}")
            )


def live(
    kafka_group: bool = False,
) -> tuple[LiveConfig, Replacer, list[str]]:
    replacer = Replacer()
    changes: list[str] = []
    config = LiveConfig(
        replace=replacer,
        effective=lambda group: {"bootstrap.servers": "k:9092", **group},
        kafka_group=lambda: kafka_group,
    )
    config.on_change = lambda: changes.append(
        f"v{config.applied.version}"
        + (f" refused v{config.rejected.version}" if config.rejected else "")
    )
    return config, replacer, changes


def running(body: Callable[[LiveConfig, Replacer, list[str]], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        config, replacer, changes = live(**kw)
        task = asyncio.create_task(config.run())
        try:
            await asyncio.wait_for(body(config, replacer, changes), 5)
        finally:
            task.cancel()

    asyncio.run(main())


def test_a_changed_property_replaces_the_consumer_and_runs_the_new_version() -> None:
    async def body(config: LiveConfig, replacer: Replacer, changes: list[str]) -> None:
        assert (config.applied.version, config.applied.group) == (0, {})
        config.offer(1, {})  # the join: nothing to replace
        await config.settled()
        assert replacer.calls == [] and config.applied.version == 1
        config.offer(2, {"fetch.max.bytes": "1048576"})
        await config.settled()
        assert replacer.calls == [{"fetch.max.bytes": "1048576"}]
        assert config.applied.version == 2
        assert config.applied.effective == {
            "bootstrap.servers": "k:9092",
            "fetch.max.bytes": "1048576",
        }
        assert config.rejected is None
        assert changes == ["v1", "v2"]

    running(body)


def test_a_refused_config_leaves_the_old_one_running_until_a_later_one_applies() -> None:
    async def body(config: LiveConfig, replacer: Replacer, changes: list[str]) -> None:
        config.offer(1, {"fetch.max.bytes": "1048576"})
        config.offer(1, {"fetch.max.bytes": "1048576"})  # the same version again: ignored
        await config.settled()
        config.offer(2, {"fetch.max.bytes": "refuse"})
        await config.settled()
        assert config.applied.version == 1
        assert config.applied.group == {"fetch.max.bytes": "1048576"}
        assert config.rejected == Rejection(2, REFUSAL)
        config.offer(3, {"fetch.max.bytes": "2097152"})
        await config.settled()
        assert (config.applied.version, config.rejected) == (3, None)
        assert changes == ["v1", "v1 refused v2", "v3"]
        assert len(replacer.calls) == 3

    running(body)


def test_offers_that_come_while_one_is_applied_collapse_to_the_newest() -> None:
    async def body(config: LiveConfig, replacer: Replacer, changes: list[str]) -> None:
        replacer.hold = True
        config.offer(1, {"fetch.max.bytes": "1"})
        await asyncio.sleep(0.05)  # being applied
        config.offer(3, {"fetch.max.bytes": "3"})
        config.offer(2, {"fetch.max.bytes": "2"})  # older than one offered: ignored
        config.offer(4, {"fetch.max.bytes": "4"})
        replacer.release.set()
        await config.settled()
        assert [c["fetch.max.bytes"] for c in replacer.calls] == ["1", "4"]
        assert config.applied.version == 4
        config.offer(3, {"fetch.max.bytes": "3"})  # older than what runs: ignored
        await config.settled()
        assert config.applied.version == 4 and len(replacer.calls) == 2

    running(body)


@pytest.mark.parametrize(("kafka_group", "replaced"), [(False, 0), (True, 1)])
def test_membership_timers_replace_only_a_subscribed_consumer(
    kafka_group: bool, replaced: int
) -> None:
    async def body(config: LiveConfig, replacer: Replacer, changes: list[str]) -> None:
        config.offer(2, {"session.timeout.ms": "30000"})
        await config.settled()
        assert len(replacer.calls) == replaced
        assert config.applied.group == {"session.timeout.ms": "30000"}

    running(body, kafka_group=kafka_group)


def test_properties_off_the_allow_list_are_dropped_and_reported() -> None:
    """Only a group record older than the allow-list can hold one."""

    async def body(config: LiveConfig, replacer: Replacer, changes: list[str]) -> None:
        config.offer(5, {"fetch.max.bytes": "1048576", "bootstrap.servers": "evil:9092"})
        await config.settled()
        assert replacer.calls == [{"fetch.max.bytes": "1048576"}]
        assert config.applied.version == 5
        assert config.rejected is not None and config.rejected.version == 5
        assert "'bootstrap.servers' changes where or as whom" in config.rejected.reason

    running(body)


# ---- Fetcher.replace_consumer --------------------------------------------------------------


class RecordingConsumer:
    made: ClassVar[list[RecordingConsumer]] = []

    def __init__(self, config: dict[str, Any], assigned: Sequence[TP] = ()) -> None:
        self.config = config
        self.assigned: list[TopicPartition] = [
            TopicPartition(t.topic, t.partition) for t in assigned
        ]
        self.paused: list[tuple[str, int]] = []
        self.closed = False
        RecordingConsumer.made.append(self)

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += partitions

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [(p.topic, p.partition) for p in partitions]

    def close(self) -> None:
        self.closed = True


def part(table: PartitionTable, p: int, position: int, **state: Any) -> Partition:
    entry = Partition(tp=TP("t", p), epoch=3, deadline=time.monotonic() + 60, acks=PartitionAcks(0))
    entry.ready = True
    entry.position = position
    for key, value in state.items():
        setattr(entry, key, value)
    table.add(entry)
    return entry


def test_the_new_consumer_takes_over_at_the_buffer_positions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetcher_module, "Consumer", RecordingConsumer)
    table = PartitionTable(64 * 1024 * 1024, time.monotonic)
    old = RecordingConsumer({}, [TP("t", p) for p in range(5)])
    fetcher = Fetcher(
        old, table, OffsetCommitter(table, sidecar_id="s"), batch=10, on_data=lambda: None
    )  # type: ignore[arg-type]
    part(table, 0, 120)
    part(table, 1, 7, paused=True)  # backpressure
    part(table, 2, 55, suspended_at=time.monotonic())  # lease deadline passed
    part(table, 3, 9, revoking=True)  # being handed off: not taken over
    # 4 is assigned but no longer in the table (given up): not taken over either.
    moved = fetcher.replace_consumer({"queued.max.messages.kbytes": 1024, "x": "y"})
    new = RecordingConsumer.made[-1]
    assert moved == 3
    assert [(p.partition, p.offset) for p in new.assigned] == [(0, 120), (1, 7), (2, 55)]
    assert new.paused == [("t", 1), ("t", 2)]
    assert old.closed and not new.closed
    assert fetcher._consumer is new  # type: ignore[comparison-overlap]
    assert table.hold_at == 64 * 1024 * 1024 - 1024 * 1024
    # Buffer, acks and leases are the table's: untouched.
    assert [p.epoch for p in table.snapshot()] == [3, 3, 3, 3]


def test_a_consumer_librdkafka_refuses_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(config: dict[str, Any]) -> None:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, REFUSAL))

    table = PartitionTable(64 * 1024 * 1024, time.monotonic)
    old = RecordingConsumer({}, [TP("t", 0)])
    fetcher = Fetcher(
        old, table, OffsetCommitter(table, sidecar_id="s"), batch=10, on_data=lambda: None
    )  # type: ignore[arg-type]
    part(table, 0, 10)
    monkeypatch.setattr(fetcher_module, "Consumer", refuse)
    with pytest.raises(KafkaException):
        fetcher.replace_consumer({})
    assert fetcher._consumer is old and not old.closed  # type: ignore[comparison-overlap]
