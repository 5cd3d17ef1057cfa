"""``dsctl dlq replay`` by time (``--since``/``--until``) and by filter (``--key``,
``--client``) on a real Kafka topic, through the real CLI (issue 39, item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer

from services.devstack.kafka import TopicFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOUR_MS = 3_600_000


def read_values(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """The values of the first ``count`` records of ``topic`` (then 2 s more for extras)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )  # fmt: skip
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        extra = None
        while time.monotonic() < (extra or deadline):
            for msg in consumer.consume(10, 0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value() or b"")
            if len(values) >= count and extra is None:
                extra = time.monotonic() + 2.0
    finally:
        consumer.close()
    return values


def dsctl(bootstrap: str, dlq: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "DS_BOOTSTRAP": bootstrap, "DS_DEAD_LETTER_TOPIC": dlq}
    done = subprocess.run(
        [sys.executable, "-m", "services.dsctl", "dlq", "replay", "g", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_replay_by_time_range_key_and_client(topic_factory: TopicFactory) -> None:
    bootstrap = topic_factory.bootstrap
    dlq, origin, out = topic_factory(partitions=2), topic_factory(), topic_factory()
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap})
    # (value, key, client, dead-lettered this long ago in ms), on both partitions
    records = [
        (b"old-a", b"a", "c1", 3 * HOUR_MS),
        (b"old-b", b"b", "c2", 3 * HOUR_MS),
        (b"new-a", b"a", "c1", 60_000),
        (b"new-b", b"b", "c2", 60_000),
        (b"mid-a", b"a", "c2", HOUR_MS + 60_000),
    ]
    for n, (value, key, client, ago) in enumerate(records):
        producer.produce(
            dlq, key=key, value=value, partition=n % 2, timestamp=now - ago,
            headers=[("ds-dlq-topic", origin.encode()), ("ds-dlq-client", client.encode()),
                     ("ds-dlq-offset", str(n).encode())],
        )  # fmt: skip
    assert producer.flush(30) == 0

    def replayed(*args: str) -> int:
        return int(dsctl(bootstrap, dlq, "--dry-run", *args)["would_replay"])  # type: ignore[call-overload]

    # (each dsctl call is a process: a few of them, each checking several bounds at once)
    assert replayed("--until", "2h") == 2  # the two old ones
    assert replayed("--since", "2h", "--key", "a") == 2  # mid-a, new-a
    assert replayed("--key", "a", "--client", "c2") == 1  # mid-a
    # a real replay of one window, to another topic: exactly its records arrive
    doc = dsctl(bootstrap, dlq, "--since", "2h", "--until", "30m", "--to-topic", out)
    assert doc["replayed"] == 1
    assert read_values(bootstrap, out, 1) == [b"mid-a"]
