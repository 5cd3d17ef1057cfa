"""Groups in either mode for e2e tests: an assigner config with ``mode``/``consumer_config``,
the mode switch as it works today (the group's record in the assigner's state topic), and
a look at the Kafka consumer group itself (members, assignor, state)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription

from services.assigner.state import STATE_TOPIC, StateSnapshot, apply_record
from tests.support.mesh import Mesh, ServiceProcess


@dataclass(frozen=True)
class GroupSpec:
    name: str
    topics: Sequence[str]
    mode: str = "leased"  # or kafka_group
    consumer_config: Mapping[str, str] = field(default_factory=dict)


def start_assigner(mesh: Mesh, groups: Sequence[GroupSpec], *args: str) -> ServiceProcess:
    """Like ``Mesh.assigner`` but each group may name its mode and consumer config."""
    config = mesh.log_dir / f"assigner-modes-{len(mesh.services)}.yaml"
    document = {
        "groups": [
            {
                "name": g.name,
                "topics": list(g.topics),
                "mode": g.mode,
                "consumer_config": dict(g.consumer_config),
            }
            for g in groups
        ]
    }
    config.write_text(yaml.safe_dump(document))
    return mesh.service("assigner", "--config", str(config), *args)


def read_state(bootstrap: str, topic: str = STATE_TOPIC) -> StateSnapshot:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ds-test-state-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    snapshot = StateSnapshot()
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return snapshot
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        position = low
        while position < high:
            msg = consumer.poll(5.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise RuntimeError(str(error))
            apply_record(snapshot, msg.key() or b"", msg.value())
            position = int(msg.offset() or 0) + 1
    finally:
        consumer.close()
    return snapshot


def set_group_mode_in_state(
    bootstrap: str, group: str, mode: str, state_topic: str = STATE_TOPIC
) -> None:
    """The mode switch as it works today (UpdateGroup refuses mode changes and the state
    wins over the YAML file): with the assigner stopped, write the group's record again
    with the new mode. Epochs and bindings are kept."""
    record = read_state(bootstrap, state_topic).groups[group]
    record.mode = mode
    record.config_version += 1
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    key = json.dumps(["group", group], separators=(",", ":")).encode()
    producer.produce(state_topic, key=key, value=json.dumps(record.to_json()).encode())
    assert producer.flush(10) == 0, "the group record was not written"


def describe_kafka_group(bootstrap: str, group: str) -> ConsumerGroupDescription:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    result: ConsumerGroupDescription = admin.describe_consumer_groups([group])[group].result(
        timeout=10
    )
    return result


def wait_kafka_group_stable(bootstrap: str, group: str, members: int, timeout: float = 60) -> None:
    """Until the Kafka group is stable with ``members`` members, each assigned partitions:
    sidecars in ``kafka_group`` mode join one after the other, and each join is a
    cooperative rebalance that revokes partitions from the others; acks of records read
    before a revoke are refused and the records read again (at least once, as any Kafka
    group). A test that counts every record exactly once reads after the last join."""
    deadline = time.monotonic() + timeout
    while True:
        description = describe_kafka_group(bootstrap, group)
        assigned = [m for m in description.members if m.assignment.topic_partitions]
        if (
            description.state == ConsumerGroupState.STABLE
            and len(description.members) == members
            and len(assigned) == members
        ):
            return
        assert time.monotonic() < deadline, (
            f"Kafka group {group} not stable with {members} members: {description.state}, "
            f"{len(description.members)} members, {len(assigned)} with partitions"
        )
        time.sleep(0.2)


def wait_kafka_group_empty(bootstrap: str, group: str, timeout: float = 60) -> None:
    """Static members of stopped sidecars stay until session.timeout.ms has passed; only an
    empty group accepts the commits of assign() consumers (ARCHITECTURE §10)."""
    deadline = time.monotonic() + timeout
    description = describe_kafka_group(bootstrap, group)
    while description.members and time.monotonic() < deadline:
        time.sleep(0.5)
        description = describe_kafka_group(bootstrap, group)
    assert not description.members, f"Kafka group {group} still has members"
