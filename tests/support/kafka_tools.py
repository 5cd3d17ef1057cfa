"""Kafka's own command-line tools, run from the devstack's Kafka jars, for tests that compare
the mesh with what an operator of plain Kafka would see: ``kafka-consumer-groups``."""

from __future__ import annotations

import subprocess

from services.devstack.kafka import LOG4J2_CONFIG, ensure_kafka_jars

CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def kafka_consumer_groups(bootstrap: str, *args: str, timeout: float = 60) -> str:
    """``kafka-consumer-groups.sh --bootstrap-server BOOTSTRAP ARGS`` (stdout; raises on a
    non-zero exit)."""
    argv = [
        "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-cp", f"{ensure_kafka_jars()}/*", CONSUMER_GROUPS,
        "--bootstrap-server", bootstrap, *args,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"kafka-consumer-groups failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def describe_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int | None]:
    """``--describe --group GROUP``'s CURRENT-OFFSET per (topic, partition); None for "-"
    (nothing committed)."""
    out: dict[tuple[str, int], int | None] = {}
    header: list[str] | None = None
    for line in kafka_consumer_groups(bootstrap, "--describe", "--group", group).splitlines():
        fields = line.split()
        if fields[:3] == ["GROUP", "TOPIC", "PARTITION"]:
            header = fields
            continue
        if header is None or len(fields) < len(header) or fields[0] != group:
            continue
        row = dict(zip(header, fields, strict=False))
        current = row["CURRENT-OFFSET"]
        out[(row["TOPIC"], int(row["PARTITION"]))] = None if current == "-" else int(current)
    return out
