"""The one topic-partition type: how every layer names a Kafka partition.

The assigner's balancer and coordinator, the sidecar's partition table and statistics, and
the Spark source's offsets all key their maps by it. It is a ``NamedTuple``, so it *is* a
``(topic, partition)`` tuple: it equals and hashes like the plain tuple (a key built as
``(topic, partition)`` finds the same entry), unpacks as one, sorts by topic and then
partition, pickles to Spark's executors, and ``json`` writes it as the same two-element
array. Nothing that stored or compared the plain tuples changes.

``TP`` is the short name, for modules that also use confluent-kafka's own
``TopicPartition`` (a mutable Kafka client object with an offset, not this key).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TP", "TopicPartition"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


TP = TopicPartition
