"""The walking skeleton's Kafka helpers, shared by the e2e tests: produce numbered records,
read a group's committed offsets and the end offsets."""

from __future__ import annotations

from tests.support import offsets, producing

PARTITIONS = 12


def produce(bootstrap: str, topic: str, count: int) -> dict[int, list[int]]:
    """Produce ``count`` records keyed by sequence, round robin over PARTITIONS; returns the
    sequences per partition."""
    return producing.produce(
        bootstrap,
        topic,
        range(count),
        partitions=PARTITIONS,
        value=lambda seq: f"value-{seq}".encode(),
    )


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return offsets.end_offsets(bootstrap, topic, PARTITIONS)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return offsets.committed_offsets(bootstrap, group, topic, PARTITIONS)
