"""Kafka's own ``kafka-consumer-groups --reset-offsets`` against a leased group, with a
producer running and a client reading (issue 23): followed, not overwritten.

One mesh for the module, as in ``test_offsets_reset.py``: real Kafka, a notifier, an
assigner reporting to it, two sidecars serving a leased group of a 4-partition topic, a
producer writing 200 records/s throughout, and a ``DsClient`` fetching and acking every
batch, every delivery recorded. Each reset is made with Kafka's own tool from the Kafka
jars, never through the mesh:

* ``--to-earliest --execute``: within 5 s of the tool's exit the client receives offset 0 of
  every partition under a new epoch of the same holder, with no error and no rebind; once
  followed, Kafka never again holds a commit of a lease from before the reset (the old
  positions are not written back; how many were between the tool's exit and the follow is
  printed); ``--describe`` shows offsets from 0 on;
* ``--shift-by -50`` on one partition: only that partition moves (the others keep their
  holder and epoch);
* each is an OFFSETS_RESET event with ``source: external`` on ds.faults, old and new offsets
  and who wrote the commit; at the end nothing produced was lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.devstack.kafka import KafkaHandle
from tests.support.external_reset import CommitWatch, tool_reset
from tests.support.kafka_tools import describe_offsets
from tests.support.offsets_reset import (
    PARTITIONS,
    Stack,
    dsctl,
    leases,
    ok_json,
    rebinds,
    running_stack,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

FOLLOW_SECONDS = 5.0


@pytest.fixture(scope="module")
def stack(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(kafka_cluster, tmp_path_factory, "external-reset", "extreset") as s:
        yield s


def follow(stack: Stack, *args: str) -> tuple[dict[int, int], float, list[Any]]:
    """Run the tool with the client reading; the client must receive each new offset under
    a new epoch of the same holder within FOLLOW_SECONDS, with no error and no rebind.
    Returns (new offsets, the tool's exit time, commit samples from it on)."""
    before, before_endpoints, before_rebinds = leases(stack), stack.client.endpoints, rebinds(stack)
    with CommitWatch(stack) as watch:
        new = tool_reset(stack, *args)
        ended = time.monotonic()

        def received() -> bool:
            with stack.tally.lock:
                seen = {
                    (d.partition, d.offset)
                    for d in stack.tally.deliveries
                    if d.fetched_at >= ended - 1 and d.epoch > before[d.partition][1]
                }
            return {(p, o) for p, o in new.items()} <= seen

        wait_for(received, FOLLOW_SECONDS, f"the client receives {new} under new epochs")
        followed = time.monotonic()
        took = followed - ended
        time.sleep(1.0)
    print(f"followed within {took:.2f} s of the tool's exit")
    after = leases(stack)
    for p, (holder, epoch) in before.items():
        if p in new:
            assert after[p][0] == holder and after[p][1] > epoch, (p, before[p], after[p])
        else:
            assert after[p] == (holder, epoch), f"partition {p} moved: {before[p]} -> {after[p]}"
    assert stack.loop.alive and stack.loop.errors == [], "the client saw an error"
    assert stack.client.endpoints == before_endpoints, "the client was rebound"
    assert rebinds(stack) == before_rebinds
    # Never the old positions again once followed: no commit of an old lease after that.
    # Between the tool's exit and the follow there can be some: a holder whose commit
    # overwrote the tool's before its check saw it (no compare-and-set on offsets in Kafka);
    # the commit log follows those (README). Printed, not asserted.
    old_commits = [(round(at - ended, 2), p, c) for at, sample in watch.samples if at > ended
                   for p, c in sample.items() if p in new and 0 < c[1] <= before[p][1]]  # fmt: skip
    late = [x for x in old_commits if x[0] > took]
    last = max((x[0] for x in old_commits), default=0.0)
    print(
        f"commits of an old lease after the tool's exit: {len(old_commits)}, last at "
        f"{last:.2f} s; after the follow: {late}"
    )
    assert late == [], f"a lease from before the reset committed after the follow: {late[:5]}"
    return new, ended, watch.samples


def test_to_earliest_is_followed(stack: Stack) -> None:
    new, _, _ = follow(stack, "--to-earliest", "--topic", stack.topic)
    assert new == dict.fromkeys(range(PARTITIONS), 0)
    described = describe_offsets(stack.bootstrap, stack.group)
    print("kafka-consumer-groups --describe:", described)
    assert all(v is not None for v in described.values())


def test_shift_by_on_one_partition_moves_only_it(stack: Stack) -> None:
    new, _, _ = follow(stack, "--shift-by", "-50", "--topic", f"{stack.topic}:1")
    assert list(new) == [1]


def test_audited_as_external_and_nothing_lost(stack: Stack) -> None:
    def audited() -> list[dict[str, Any]] | None:
        doc = ok_json(dsctl(stack, "faults", "--group", stack.group, "--type", "OFFSETS_RESET",
                            "-o", "json"))  # fmt: skip
        events = [f for f in doc["faults"] if f["state"] == "OPEN"]
        return events if len(events) >= 2 else None

    events = wait_for(audited, 60, "an OFFSETS_RESET event per external reset")
    print(json.dumps(events, indent=2))
    assert all(e["attributes"]["source"] == "external" for e in events)
    assert all("no commit metadata" in e["attributes"]["actor"] for e in events)
    assert all(e["attributes"]["detected_by"] for e in events)
    # --to-earliest: one event per reset the assigner made (the holders' reports together,
    # the commit log's apart); together every partition, each from its old offset to 0.
    to_zero = {}
    shifted = []
    for e in events:
        for part in e["attributes"]["offsets"].split(","):
            p, moves = part.split(":")
            old, new = (int(x) for x in moves.split("->"))
            (to_zero.__setitem__(int(p), old) if new == 0 else shifted.append((int(p), old, new)))
    assert sorted(to_zero) == list(range(PARTITIONS)) and all(o > 0 for o in to_zero.values())
    [(partition, old, new)] = shifted
    assert partition == 1 and old > new > 0

    confirmed = stack.producer.confirmed()
    wait_for(lambda: not (confirmed - stack.tally.received()), 60, "every record")
    print(
        f"external resets: produced {len(confirmed)}, received {len(stack.tally.received())}, "
        f"lost {len(confirmed - stack.tally.received())}, delivered again after the resets "
        f"{stack.tally.duplicate_count()} (by design), client errors {stack.loop.errors}"
    )
