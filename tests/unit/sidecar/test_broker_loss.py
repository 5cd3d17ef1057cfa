"""A fetch consumer whose librdkafka forgot every broker is made anew (broker_loss.py).

The statistics documents below are shaped as librdkafka 2.16 writes them: the stuck one is
what the bare consumers of the 4 Dec reproduction listed (only the logical
``GroupCoordinator`` entry, node -1, state INIT), the outage one what a client lists while
every broker is down (its learned brokers, down), the healthy one what a consumer of the
scratch broker listed."""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.consumer_sidecar.broker_loss import REPLACE_AFTER_SECONDS, BrokerLoss
from services.consumer_sidecar.fault_emitters import SidecarFaults
from services.consumer_sidecar.kafka_callbacks import KafkaCallbacks
from services.consumer_sidecar.metrics import SidecarMetrics
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.stats import knows_a_broker, parse_statistics


def broker(name: str, nodeid: int, state: str, source: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "nodeid": nodeid, "state": state}
    if source is not None:
        entry["source"] = source
    return entry


def document(*brokers: dict[str, Any]) -> str:
    return json.dumps({"time": 0, "brokers": {b["name"]: b for b in brokers}, "topics": {}})


COORDINATOR = broker("GroupCoordinator", -1, "INIT", "logical")
STUCK = document(COORDINATOR)
OUTAGE = document(
    broker("GroupCoordinator", -1, "DOWN", "logical"),
    broker("127.0.0.1:9092/bootstrap", -1, "DOWN", "configured"),
    broker("127.0.0.1:9092/1", 1, "TRY_CONNECT", "learned"),
)
UP = document(
    broker("127.0.0.1:29092/0", 0, "UP", "learned"), broker("GroupCoordinator", -1, "UP", "logical")
)


def test_a_client_that_lists_only_logical_or_internal_entries_knows_no_broker() -> None:
    assert not knows_a_broker(parse_statistics(STUCK))
    internal = broker(":0/internal", -1, "INIT", "internal")
    assert not knows_a_broker(parse_statistics(document(internal, COORDINATOR)))


def test_a_client_in_an_outage_still_knows_its_brokers() -> None:
    assert knows_a_broker(parse_statistics(OUTAGE))
    assert knows_a_broker(parse_statistics(UP))


def test_no_statistics_say_nothing() -> None:
    assert knows_a_broker(parse_statistics(""))
    assert knows_a_broker(parse_statistics("{not json"))


def test_without_a_source_field_node_ids_and_names_tell_them_apart() -> None:
    old_stuck = document(
        broker(":0/internal", -1, "INIT", None), broker("GroupCoordinator", -1, "INIT", None)
    )
    old_outage = document(
        broker(":0/internal", -1, "INIT", None), broker("b:9092/bootstrap", -1, "DOWN", None)
    )
    assert not knows_a_broker(parse_statistics(old_stuck))
    assert knows_a_broker(parse_statistics(old_outage))
    assert knows_a_broker(parse_statistics(document(broker("b:9092/2", 2, "DOWN", None))))


def test_replacement_is_asked_once_after_the_interval_and_again_after_a_replacement() -> None:
    loss = BrokerLoss(after=10.0)
    assert not loss.seen(False, 100.0)
    assert not loss.seen(False, 109.9)
    assert loss.seen(False, 110.0)
    assert not loss.seen(False, 111.0)  # asked already: not again until replaced
    loss.replaced()
    assert not loss.seen(False, 112.0)  # the new consumer gets its own interval
    assert loss.seen(False, 122.0)


def test_a_broker_known_again_resets_the_interval() -> None:
    loss = BrokerLoss(after=10.0)
    assert not loss.seen(False, 0.0)
    assert not loss.seen(True, 9.0)
    assert not loss.seen(False, 15.0)
    assert not loss.seen(False, 24.0)
    assert loss.seen(False, 25.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 5)), max_size=60))
def test_never_asked_before_the_interval_of_no_broker_has_passed(
    steps: list[tuple[bool, float]],
) -> None:
    """Property: a request comes only at a look that ends ``after`` seconds of looks
    without a broker, and at most once between two replacements."""
    loss = BrokerLoss(after=10.0)
    now, since, asked = 0.0, None, False
    for knows, gap in steps:
        now += gap
        since = None if knows else (now if since is None else since)
        got = loss.seen(knows, now)
        if got:
            assert since is not None and now - since >= 10.0
            assert not asked
            asked = True
        if knows:
            assert not got


def callbacks(clock: list[float], calls: list[int]) -> KafkaCallbacks:
    registry = CollectorRegistry()
    return KafkaCallbacks(
        PartitionTable(64 * 1024 * 1024, time.monotonic),
        SidecarMetrics(registry, "g"),
        SidecarFaults(None, "g", "pod-a"),
        on_broker_loss=lambda: calls.append(1),
        clock=lambda: clock[0],
    )


def test_the_statistics_callback_asks_for_a_new_consumer_once_per_loss() -> None:
    clock, calls = [0.0], []
    hooks = callbacks(clock, calls)
    for t in range(0, 30):  # an outage: brokers listed (down), never a replacement
        clock[0] = float(t)
        hooks.on_stats(OUTAGE)
    assert calls == []
    for t in range(30, 30 + int(REPLACE_AFTER_SECONDS) + 5):  # librdkafka forgot them
        clock[0] = float(t)
        hooks.on_stats(STUCK)
    assert calls == [1]
    hooks.replaced()  # the new consumer, stuck as well: replaced again after the interval
    for t in range(45, 45 + int(REPLACE_AFTER_SECONDS) + 1):
        clock[0] = float(t)
        hooks.on_stats(STUCK)
    assert calls == [1, 1]
    hooks.replaced()
    clock[0] = 100.0
    hooks.on_stats(UP)
    clock[0] = 200.0
    hooks.on_stats(UP)
    assert calls == [1, 1]
