"""The Kafka a benchmark runs on: the one ``--bootstrap`` names, else a 1-broker cluster of
its own for the run (stopped when the run ends, whatever happens). Written once here
instead of in each benchmark's ``main``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from services.devstack.kafka import KafkaCluster, KafkaOptions


@dataclass(frozen=True)
class BenchKafka:
    bootstrap: str
    cluster: KafkaCluster | None  # None: an existing broker, not started here


@contextlib.contextmanager
def bench_kafka(
    bootstrap: str | None, *, options: KafkaOptions | None = None, announce: bool = False
) -> Iterator[BenchKafka]:
    """``bootstrap`` as it is, or a broker started now (``options``: one broker by default;
    its start time printed if ``announce``) and stopped on leaving."""
    if bootstrap is not None:
        yield BenchKafka(bootstrap, None)
        return
    started = time.monotonic()
    cluster = KafkaCluster(options or KafkaOptions(brokers=1)).start()
    if announce:
        print(f"kafka started in {time.monotonic() - started:.1f}s at {cluster.bootstrap}")
    try:
        yield BenchKafka(cluster.bootstrap, cluster)
    finally:
        cluster.stop()
