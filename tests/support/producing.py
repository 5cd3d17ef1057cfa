"""Producing test records to Kafka: the one ``produce`` the e2e and integration tests share
(it was written again in a dozen test modules, each with its own key, value and partition
choice; those choices are its parameters now)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer


def _v(_seq: int) -> bytes:
    return b"v"


def track_ends(ends: dict[int, int]) -> Callable[[int, Message], None]:
    """A ``delivered`` callback for :func:`produce` that raises ``ends[partition]`` to the
    offset after each record delivered there."""

    def note(_seq: int, msg: Message) -> None:
        partition = msg.partition()
        ends[partition] = max(ends[partition], msg.offset() + 1)  # type: ignore[index,operator]

    return note


def produce(
    bootstrap: str,
    topic: str,
    seqs: Iterable[int],
    *,
    partitions: int | None = None,
    partition_of: Callable[[int], int] | None = None,
    value: Callable[[int], bytes] = _v,
    keyed: bool = True,
    key: Callable[[int], bytes] | None = None,
    headers: Callable[[int], list[tuple[str, bytes]]] | None = None,
    delivered: Callable[[int, Message], None] | None = None,
    idempotent: bool = True,
    linger_ms: int | None = None,
    flush_timeout: float = 30,
) -> dict[int, list[int]]:
    """One record per sequence number in ``seqs``: key ``key(seq)``, else ``str(seq)``
    (none if not ``keyed``), value ``value(seq)``, headers ``headers(seq)`` if given,
    partition ``partition_of(seq)``, else ``seq % partitions``, else Kafka's partitioner's.
    Every record is delivered (flushed) before it returns the sequences per partition it
    chose (-1: Kafka's choice). With ``delivered``, each record's delivery report is passed
    to it with its sequence number, and a delivery error fails the call."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if idempotent:
        config["enable.idempotence"] = True
    if linger_ms is not None:
        config["linger.ms"] = linger_ms
    producer = Producer(config)
    expected: dict[int, list[int]] = defaultdict(list)
    errors: list[KafkaError] = []

    def report(seq: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            elif delivered is not None:
                delivered(seq, msg)

        return on_delivery

    for i, seq in enumerate(seqs):
        if partition_of is not None:
            partition = partition_of(seq)
        elif partitions is not None:
            partition = seq % partitions
        else:
            partition = -1
        extra: dict[str, Any] = {} if partition < 0 else {"partition": partition}
        if headers is not None:
            extra["headers"] = headers(seq)
        if delivered is not None:
            extra["on_delivery"] = report(seq)
        record_key = key(seq) if key is not None else str(seq).encode() if keyed else None
        producer.produce(topic, key=record_key, value=value(seq), **extra)
        expected[partition].append(seq)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(flush_timeout) == 0, "not every record was delivered to Kafka"
    assert not errors, f"delivery errors: {errors[:5]}"
    return expected
