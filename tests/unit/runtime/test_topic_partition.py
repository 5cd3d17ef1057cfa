"""The shared topic-partition type behaves as the plain ``(topic, partition)`` tuples that the
assigner, the sidecar and Spark's offsets used before it: same keys, order, JSON, pickle.
(Spark's checkpoint offsets: tests/spark/test_offsets.py.)"""

from __future__ import annotations

import json
import pickle

from services.runtime.topic_partition import TP, TopicPartition


def test_equal_and_hashed_as_the_plain_tuple() -> None:
    tp = TopicPartition("orders", 3)
    assert TP is TopicPartition
    assert tp == ("orders", 3) and hash(tp) == hash(("orders", 3))
    assert {("orders", 3): 7}[tp] == 7 and {tp: 7}[("orders", 3)] == 7
    topic, partition = tp
    assert (topic, partition, tp.topic, tp.partition) == ("orders", 3, "orders", 3)


def test_sorts_by_topic_then_partition() -> None:
    tps = [TP("b", 0), TP("a", 10), TP("a", 2)]
    assert sorted(tps) == [("a", 2), ("a", 10), ("b", 0)]


def test_json_and_pickle_as_the_plain_tuple() -> None:
    assert json.dumps([TP("t", 1)]) == json.dumps([("t", 1)]) == '[["t", 1]]'
    restored = pickle.loads(pickle.dumps(TP("t", 1)))
    assert restored == ("t", 1) and isinstance(restored, TopicPartition)
