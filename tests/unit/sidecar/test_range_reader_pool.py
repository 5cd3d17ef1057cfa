"""The range readers' consumer pool (services/consumer_sidecar/reader.py): a read that ended
at its range's end gives its consumer back, unassigned, and the next read takes it; a read
that failed or was stopped closes its consumer; a consumer made with another config (the
sidecar's config changes live) or idle too long is closed, never reused."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.consumer_sidecar import reader
from services.consumer_sidecar.reader import RangeReaders, RangeSpec
from services.runtime.topic_partition import TP
from tests.support.kafka_messages import Eof, Msg


class FakeConsumer:
    """Serves offsets [from, to) of whatever it is assigned, then the end of the log."""

    made: ClassVar[list[FakeConsumer]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.assigned: list[Any] = []
        self.closed = False
        self.unassigns = 0
        self.fail_consume = False
        FakeConsumer.made.append(self)

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, 100

    def assign(self, tps: list[Any]) -> None:
        assert not self.closed
        self.assigned = tps
        self._next = tps[0].offset

    def unassign(self) -> None:
        self.assigned = []
        self.unassigns += 1

    def consume(self, num: int, timeout: float) -> list[Msg | Eof]:
        if self.fail_consume:
            raise KafkaException(KafkaError(KafkaError._FATAL, fatal=True))
        end = min(self._next + num, 100)
        batch: list[Msg | Eof] = [
            Msg(o, None, b"v", (0, -1), None, partition=0, topic="t")
            for o in range(self._next, end)
        ]
        self._next += len(batch)
        return [*batch, Eof(self._next)] if self._next >= 100 else batch

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def config() -> dict[str, Any]:
    FakeConsumer.made = []
    return {"bootstrap.servers": "x:1", "group.id": "g.ds-reader"}


@pytest.fixture(autouse=True)
def fake_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "Consumer", FakeConsumer)


def spec(start: int = 0, end: int = 10, *, arrow: bool = False) -> RangeSpec:
    return RangeSpec(TP("t", 0), start, end, 1 << 20, epoch=1, arrow=arrow)


def read_all(readers: RangeReaders, the_spec: RangeSpec) -> list[int]:
    read = readers.open(the_spec)
    offsets: list[int] = []
    while (chunk := read.next_chunk()) is not None:
        offsets += [r.offset for r in chunk.records]
        if chunk.next_offset >= the_spec.to_offset:
            break
    read.close()
    return offsets


def test_a_read_that_reached_its_end_gives_its_consumer_to_the_next(config: dict[str, Any]) -> None:
    readers = RangeReaders(lambda: config)
    assert read_all(readers, spec(0, 10)) == list(range(10))
    assert readers.idle() == 1 and readers.consumers_made == 1
    first = FakeConsumer.made[0]
    assert first.unassigns == 1 and not first.closed and first.assigned == []
    # The next read (another range, the Arrow format too) takes it: no new consumer.
    assert read_all(readers, spec(40, 55)) == list(range(40, 55))
    read = readers.open(spec(90, 100, arrow=True))
    chunk = read.next_chunk()
    assert chunk is not None and chunk.count == 10 and chunk.next_offset == 100
    read.close()
    assert readers.consumers_made == 1 and readers.idle() == 1
    readers.close()
    assert first.closed and readers.idle() == 0


def test_reads_at_once_each_have_a_consumer_and_the_pool_is_bounded(
    config: dict[str, Any],
) -> None:
    readers = RangeReaders(lambda: config, max_idle=2)
    reads = [readers.open(spec(0, 5)) for _ in range(3)]
    assert len({id(r._consumer) for r in reads}) == 3
    for read in reads:
        while read.next_chunk() is not None:
            pass
        read.close()
    assert readers.idle() == 2
    assert [c.closed for c in FakeConsumer.made] == [False, False, True]


def test_a_stopped_or_failed_read_closes_its_consumer(config: dict[str, Any]) -> None:
    readers = RangeReaders(lambda: config)
    stopped = readers.open(spec(0, 50))
    assert stopped.next_chunk() is not None  # the whole range fits one chunk ...
    stopped2 = readers.open(spec(0, 50))
    stopped2.close()  # ... this one is stopped before its end
    assert FakeConsumer.made[1].closed
    failing = readers.open(spec(0, 50))
    FakeConsumer.made[2].fail_consume = True
    with pytest.raises(KafkaException):
        failing.next_chunk()
    failing.close()
    assert FakeConsumer.made[2].closed and readers.idle() == 0
    stopped.close()  # ended cleanly (the chunk reached the end): kept
    assert readers.idle() == 1


def test_a_range_outside_the_log_closes_the_consumer(config: dict[str, Any]) -> None:
    readers = RangeReaders(lambda: config)
    with pytest.raises(reader.RangeOutOfRange):
        readers.open(spec(0, 200))
    assert FakeConsumer.made[0].closed and readers.idle() == 0


def test_a_consumer_made_with_another_config_or_idle_too_long_is_not_reused(
    config: dict[str, Any],
) -> None:
    # Callbacks (made anew per config) do not count; settings do.
    readers = RangeReaders(lambda: {**config, "error_cb": lambda error: None})
    read_all(readers, spec())
    read_all(readers, spec())
    assert readers.consumers_made == 1
    config["fetch.max.bytes"] = 1024  # a live config change
    read_all(readers, spec())
    assert readers.consumers_made == 2 and FakeConsumer.made[0].closed
    readers.idle_seconds = 0.0
    read_all(readers, spec())
    assert readers.consumers_made == 3 and FakeConsumer.made[1].closed
