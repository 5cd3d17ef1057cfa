"""Producing test records to Kafka: the one ``produce`` the e2e and integration tests share
(it was written again in a dozen test modules, each with its own key, value and partition
choice; those choices are its parameters now)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Producer


def _v(_seq: int) -> bytes:
    return b"v"


def produce(
    bootstrap: str,
    topic: str,
    seqs: Iterable[int],
    *,
    partitions: int | None = None,
    partition_of: Callable[[int], int] | None = None,
    value: Callable[[int], bytes] = _v,
    keyed: bool = True,
    idempotent: bool = True,
    linger_ms: int | None = None,
    flush_timeout: float = 30,
) -> dict[int, list[int]]:
    """One record per sequence number in ``seqs``: key ``str(seq)`` (none if not
    ``keyed``), value ``value(seq)``, partition ``partition_of(seq)``, else
    ``seq % partitions``, else Kafka's partitioner's. Every record is delivered (flushed)
    before it returns the sequences per partition it chose (-1: Kafka's choice)."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if idempotent:
        config["enable.idempotence"] = True
    if linger_ms is not None:
        config["linger.ms"] = linger_ms
    producer = Producer(config)
    expected: dict[int, list[int]] = defaultdict(list)
    for i, seq in enumerate(seqs):
        if partition_of is not None:
            partition = partition_of(seq)
        elif partitions is not None:
            partition = seq % partitions
        else:
            partition = -1
        extra: dict[str, Any] = {} if partition < 0 else {"partition": partition}
        key = str(seq).encode() if keyed else None
        producer.produce(topic, key=key, value=value(seq), **extra)
        expected[partition].append(seq)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(flush_timeout) == 0, "not every record was delivered to Kafka"
    return expected
