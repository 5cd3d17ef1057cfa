"""``dsctl offsets reset`` on the real mesh with a producer running and a client reading
(issue 16, item 2).

One mesh for the module: real Kafka, a notifier, an assigner reporting to it, two sidecars
serving a leased group of a 4-partition topic, a producer writing 200 records/s
throughout, and a ``DsClient`` bound to the group fetching and acking every batch, every
delivery recorded (partition, offset, lease epoch, whether its ack was accepted). Each
reset runs through the real ``dsctl`` and is checked on what the client receives and what
Kafka holds:

* ``--to-earliest --execute``: the client receives offset 0 of every partition again,
  under the reset's new epoch, with no error and no rebind; no ack of a record delivered
  before the reset is accepted after it, and every commit Kafka holds afterwards carries
  an epoch >= the reset's; ``kafka-consumer-groups --describe`` (Kafka's own tool, from the
  Kafka jars) shows the same committed offsets as ``dsctl lag``;
* ``--shift-by -100``, ``--to-datetime`` (equal to the broker's offsets-for-times) and
  ``--to-offset`` on one partition (the others untouched) likewise;
* a dry run changes nothing; bad input exits 1 or 2 naming the problem; each executed
  reset is an OFFSETS_RESET event on ds.faults; at the end nothing produced was lost.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from services.devstack.kafka import KafkaHandle
from tests.support.kafka_tools import describe_offsets
from tests.support.offsets_reset import (
    PARTITIONS,
    Stack,
    committed,
    dsctl,
    leases,
    ok_json,
    rebinds,
    running_stack,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


def settled_commits(stack: Stack) -> dict[int, tuple[int, int]]:
    """The commits once the stopped client's last acks have landed (two equal reads)."""
    previous = committed(stack)
    for _ in range(20):
        time.sleep(1.0)
        current = committed(stack)
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"commits never settled: {previous}")


def execute(stack: Stack, *flags: str) -> tuple[dict[str, Any], float, float]:
    """Run an executed reset with the client reading; (document, start, end) monotonic."""
    before_endpoints, before_rebinds = stack.client.endpoints, rebinds(stack)
    started = time.monotonic()
    doc = ok_json(
        dsctl(stack, "offsets", "reset", stack.group, *flags, "--execute", "--yes", "-o", "json")
    )
    ended = time.monotonic()
    print(json.dumps(doc))
    assert not doc["dry_run"] and all(p["applied"] for p in doc["partitions"])
    stack.resets.append(doc)
    for p in doc["partitions"]:
        assert p["epoch"] is not None
    wait_received_again(stack, doc, started)
    assert stack.loop.alive and stack.loop.errors == [], "the client saw an error"
    assert stack.client.endpoints == before_endpoints, "the client was rebound"
    assert rebinds(stack) == before_rebinds, "the assigner rebound the group's clients"
    no_old_ack_accepted_after(stack, doc, ended)
    return doc, started, ended


def wait_received_again(stack: Stack, doc: dict[str, Any], since: float) -> None:
    """The client receives each partition's new offset, under the reset's epoch."""
    wanted = {(p["partition"], p["new_offset"], p["epoch"]) for p in doc["partitions"]
              if p["new_offset"] < stack.producer.sent}  # fmt: skip

    def received() -> bool:
        with stack.tally.lock:
            seen = {(d.partition, d.offset, d.epoch) for d in stack.tally.deliveries
                    if d.fetched_at >= since}  # fmt: skip
        return wanted <= seen

    wait_for(received, 30, f"the client receives {sorted(wanted)} again")


def no_old_ack_accepted_after(stack: Stack, doc: dict[str, Any], ended: float) -> None:
    """Records delivered under an epoch older than the reset's: none acked after it."""
    epochs = {p["partition"]: p["epoch"] for p in doc["partitions"]}
    with stack.tally.lock:
        late = [d for d in stack.tally.deliveries
                if d.partition in epochs and d.epoch < epochs[d.partition]
                and d.acked and d.acked_at > ended]  # fmt: skip
    assert late == [], f"acks of records from before the reset accepted after it: {late[:5]}"


@pytest.fixture(scope="module")
def stack(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(kafka_cluster, tmp_path_factory, "offsets-reset", "reset") as s:
        yield s


def test_to_earliest_with_the_client_reading(stack: Stack) -> None:
    before = leases(stack)
    doc, _, _ = execute(stack, "--to-earliest")
    assert [p["new_offset"] for p in doc["partitions"]] == [0] * PARTITIONS
    after = leases(stack)
    for p in doc["partitions"]:
        holder, epoch = before[p["partition"]]
        assert p["old_offset"] is not None and p["old_offset"] > 0
        assert p["epoch"] == epoch + 1, "committed under a new epoch"
        assert after[p["partition"]] == (holder, epoch + 1), "granted back to the same holder"

    # Kafka's own tool and dsctl lag agree; every commit since carries the new epoch.
    stack.loop.stop()
    try:
        commits = settled_commits(stack)
        for p in doc["partitions"]:
            assert commits[p["partition"]][1] >= p["epoch"], "a commit from before the reset"
        lag = ok_json(dsctl(stack, "lag", stack.group, "-o", "json"))
        from_dsctl = {(p["topic"], p["partition"]): p["committed"]
                      for p in lag["groups"][0]["partitions"]}  # fmt: skip
        from_kafka = describe_offsets(stack.bootstrap, stack.group)
        print("kafka-consumer-groups --describe:", from_kafka, "dsctl lag:", from_dsctl)
        assert from_kafka == from_dsctl == {(stack.topic, p): c for p, (c, _) in commits.items()}
    finally:
        stack.restart_loop()


def test_shift_by_minus_100(stack: Stack) -> None:
    doc, _, _ = execute(stack, "--shift-by", "-100")
    for p in doc["partitions"]:
        assert p["target_offset"] == p["old_offset"] - 100
        assert p["new_offset"] == max(0, p["old_offset"] - 100)
        assert p["clamped"] == (p["old_offset"] < 100)


def test_to_datetime_equals_the_brokers_offsets_for_times(stack: Stack) -> None:
    # A time within what was produced: the records of about 3 s ago.
    when_ms = int(time.time() * 1000) - 3000
    when = datetime.datetime.fromtimestamp(when_ms / 1000, datetime.UTC)
    text = when.isoformat(timespec="milliseconds")
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "reset-times"})
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(stack.topic, p, when_ms) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    expected = {tp.partition: tp.offset for tp in found}
    preview = ok_json(dsctl(stack, "offsets", "reset", stack.group, "--to-datetime", text, "-o",
                            "json"))  # fmt: skip
    assert {p["partition"]: p["new_offset"] for p in preview["partitions"]} == expected
    doc, _, _ = execute(stack, "--to-datetime", text)
    assert {p["partition"]: p["new_offset"] for p in doc["partitions"]} == expected
    assert all(offset > 0 for offset in expected.values())


def test_to_offset_on_one_partition(stack: Stack) -> None:
    before = leases(stack)
    doc, _, _ = execute(stack, "--to-offset", "5", "--topic", f"{stack.topic}:2")
    [p] = doc["partitions"]
    assert (p["partition"], p["new_offset"]) == (2, 5)
    after = leases(stack)
    assert {k: v for k, v in after.items() if k != 2} == {k: v for k, v in before.items() if k != 2}
    assert after[2] == (before[2][0], before[2][1] + 1)


def test_dry_run_changes_nothing(stack: Stack) -> None:
    stack.loop.stop()
    try:
        commits, holders = settled_commits(stack), leases(stack)
        doc = ok_json(dsctl(stack, "offsets", "reset", stack.group, "--to-earliest", "-o", "json"))
        assert doc["dry_run"] and not any(p["applied"] for p in doc["partitions"])
        assert [p["new_offset"] for p in doc["partitions"]] == [0] * PARTITIONS
        assert {p["partition"]: p["old_offset"] for p in doc["partitions"]} == {
            p: c for p, (c, _) in commits.items()
        }
        time.sleep(2.0)
        assert committed(stack) == commits and leases(stack) == holders
    finally:
        stack.restart_loop()


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("nope-group", "--to-earliest"), 2, "GROUP_NOT_FOUND"),
        (("{group}", "--to-earliest", "--topic", "nope"), 1, "not a topic of the group"),
        (("{group}", "--to-earliest", "--topic", "{topic}:9"), 1, "has partitions 0..3"),
        (("{group}", "--to-offset", "-5"), 1, "an offset must be >= 0"),
        (("{group}", "--to-datetime", "2999-01-01T00:00:00Z"), 1, "is in the future"),
        (("{group}", "--to-earliest", "--to-latest"), 1, "exactly one"),
    ],
)
def test_bad_input_exits_with_a_clear_message(
    stack: Stack, args: tuple[str, ...], code: int, says: str
) -> None:
    argv = [a.format(group=stack.group, topic=stack.topic) for a in args]
    result = dsctl(stack, "offsets", "reset", *argv, "--execute", "--yes")
    print(result.stderr)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert says in result.stderr and "Traceback" not in result.stderr


def test_every_reset_is_audited_and_nothing_was_lost(stack: Stack) -> None:
    assert len(stack.resets) == 4, "the resets above ran first"

    def audited() -> list[dict[str, Any]] | None:
        doc = ok_json(dsctl(stack, "faults", "--group", stack.group, "--type", "OFFSETS_RESET",
                            "-o", "json"))  # fmt: skip
        events = [f for f in doc["faults"] if f["state"] == "OPEN"]
        return events if len(events) >= len(stack.resets) else None

    events = wait_for(audited, 60, "an OFFSETS_RESET event per reset")
    print(json.dumps(events[0], indent=2))
    assert all(e["attributes"]["source"] == "admin" for e in events)
    assert all("@" in e["attributes"]["actor"] for e in events)
    earliest = next(e for e in events if e["attributes"]["strategy"] == "earliest")
    assert earliest["partitions"] == list(range(PARTITIONS))
    assert all("->0" in part for part in earliest["attributes"]["offsets"].split(","))

    confirmed = stack.producer.confirmed()
    missing = wait_for(lambda: not (confirmed - stack.tally.received()), 60, "every record")
    assert missing
    print(
        f"offsets reset: produced {len(confirmed)}, received {len(stack.tally.received())}, "
        f"lost {len(confirmed - stack.tally.received())}, delivered again after the resets "
        f"{stack.tally.duplicate_count()} (by design), client errors {stack.loop.errors}"
    )
