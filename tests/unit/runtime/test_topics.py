"""The pure parts of services/runtime/topics.py: what a topic is created with, which
CreateTopics error means "there already", and how delivery reports settle a write's future.
Their Kafka behaviour is tests/integration/test_topics.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st

from services.runtime.topics import Delivery, TopicSpec, already_exists


class Sent:
    """What librdkafka hands a delivery callback, as far as Delivery reads it."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


# -- TopicSpec.new_topic -------------------------------------------------------------------


@given(brokers=st.integers(min_value=1, max_value=50))
def test_open_replication_follows_the_cluster_up_to_three_with_min_insync_up_to_two(
    brokers: int,
) -> None:
    request = TopicSpec("t", 4, config={"cleanup.policy": "compact"}).new_topic(brokers)
    assert request.topic == "t"
    assert request.num_partitions == 4
    assert request.replication_factor == min(3, brokers)
    assert request.config == {
        "cleanup.policy": "compact",
        "min.insync.replicas": str(min(2, brokers)),
    }


def test_open_replication_keeps_a_min_insync_the_spec_names() -> None:
    request = TopicSpec("t", config={"min.insync.replicas": "1"}).new_topic(3)
    assert request.replication_factor == 3
    assert request.config == {"min.insync.replicas": "1"}


@given(brokers=st.integers(min_value=1, max_value=50), replication=st.integers(1, 7))
def test_a_given_replication_is_used_as_it_is_and_adds_no_config(
    brokers: int, replication: int
) -> None:
    request = TopicSpec("t", 2, replication, {"retention.ms": "1000"}).new_topic(brokers)
    assert request.replication_factor == replication
    assert request.config == {"retention.ms": "1000"}


# -- already_exists ------------------------------------------------------------------------


def test_already_exists_is_only_topic_already_exists() -> None:
    assert already_exists(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
    assert not already_exists(KafkaException(KafkaError(KafkaError.POLICY_VIOLATION)))
    assert not already_exists(KafkaException("no KafkaError inside"))
    assert not already_exists(RuntimeError(KafkaError.TOPIC_ALREADY_EXISTS))


# -- Delivery ------------------------------------------------------------------------------


def test_offsets_come_in_record_order_whatever_order_the_reports_arrive_in() -> None:
    async def scenario() -> list[int]:
        delivery = Delivery(asyncio.get_running_loop(), 3, "t", timeout=5)
        for index, offset in ((2, 12), (0, 10), (1, 11)):
            delivery.callback(index)(None, Sent(offset))  # type: ignore[arg-type]
        return await delivery.future

    assert asyncio.run(scenario()) == [10, 11, 12]


def test_reports_from_another_thread_settle_the_future_on_the_loop() -> None:
    async def scenario() -> list[int]:
        delivery = Delivery(asyncio.get_running_loop(), 2, "t", timeout=5)
        reports = [
            threading.Thread(target=delivery.callback(i), args=(None, Sent(40 + i)))
            for i in range(2)
        ]
        for thread in reports:
            thread.start()
        for thread in reports:
            thread.join()
        return await delivery.future

    assert asyncio.run(scenario()) == [40, 41]


def test_the_first_delivery_error_fails_the_write_and_later_reports_are_dropped() -> None:
    async def scenario() -> None:
        delivery = Delivery(asyncio.get_running_loop(), 2, "t", timeout=5)
        delivery.callback(0)(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), Sent(-1))  # type: ignore[arg-type]
        delivery.callback(1)(None, Sent(7))  # type: ignore[arg-type]
        with pytest.raises(KafkaException) as raised:
            await delivery.future
        assert raised.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE

    asyncio.run(scenario())


def test_a_write_not_acknowledged_in_time_fails_with_timeout_error() -> None:
    async def scenario() -> None:
        delivery = Delivery(asyncio.get_running_loop(), 2, "t-slow", timeout=0.05)
        delivery.callback(0)(None, Sent(3))  # type: ignore[arg-type]
        with pytest.raises(
            TimeoutError, match=r"topic t-slow: 1 of 2 record\(s\) not acknowledged"
        ):
            await delivery.future
        delivery.settle(1, None, 4)  # a late report changes nothing

    asyncio.run(scenario())


def test_a_settled_write_cancels_its_timer() -> None:
    async def scenario() -> list[int]:
        delivery = Delivery(asyncio.get_running_loop(), 1, "t", timeout=0.05)
        delivery.settle(0, None, 9)
        await asyncio.sleep(0.1)  # past the timeout: the result stands
        return await delivery.future

    assert asyncio.run(scenario()) == [9]


def test_no_records_is_done_at_once() -> None:
    async def scenario() -> list[int]:
        return await Delivery(asyncio.get_running_loop(), 0, "t", timeout=5).future

    assert asyncio.run(scenario()) == []
