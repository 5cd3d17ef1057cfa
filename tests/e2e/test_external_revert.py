"""A leased group set to ``external_offset_changes: revert`` (issue 23 item 4): Kafka's own
``kafka-consumer-groups --reset-offsets --to-earliest --execute`` is undone, not followed.

The stack of ``test_external_reset.py`` (real Kafka, a notifier, an assigner, two sidecars
of a 4-partition leased group, a producer at 200 records/s, a ``DsClient`` fetching and
acking every batch, every delivery recorded), with the group switched to revert by
``dsctl offsets external GROUP revert`` while it runs. Then the tool resets every
partition to 0:

* within 5 s Kafka holds the mesh's positions again (at or past where they were before the
  tool ran, in commits of the same leases);
* the client never sees a rewind: no delivery after the tool ran is below what it had
  been given before, the leases keep their holder and epoch, no error, no rebind;
* an OFFSETS_RESET event on ds.faults says so, once per partition: source external, action
  reverted, from the tool's 0 back to the mesh's position, and who wrote the commit;
* ``dsctl describe`` names the holder (under its unchanged epoch) as the last committer;
* nothing produced is lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.devstack.kafka import KafkaHandle
from tests.support.external_reset import CommitWatch, tool_reset
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

REVERT_SECONDS = 5.0


@pytest.fixture(scope="module")
def stack(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(kafka_cluster, tmp_path_factory, "external-revert", "extrevert") as s:
        yield s


def test_dsctl_sets_revert_live(stack: Stack) -> None:
    doc = ok_json(dsctl(stack, "offsets", "external", stack.group, "revert", "-o", "json"))
    print(json.dumps(doc))
    assert (doc["external_offset_changes_before"], doc["external_offset_changes"]) == (
        "follow",
        "revert",
    )
    version = doc["config_version"]

    def applied() -> bool:
        described = ok_json(dsctl(stack, "describe", stack.group, "-o", "json"))
        members = described["members"]
        return len(members) == 2 and all(m["applied_config_version"] == version for m in members)

    wait_for(applied, 30, f"both sidecars run config v{version}")
    described = ok_json(dsctl(stack, "describe", stack.group, "-o", "json"))
    assert described["config"]["external_offset_changes"] == "revert"


def test_to_earliest_is_reverted_and_the_client_never_rewinds(stack: Stack) -> None:
    before_leases, before_rebinds = leases(stack), rebinds(stack)
    before_endpoints = stack.client.endpoints
    with stack.tally.lock:
        seen_max = {}
        for d in stack.tally.deliveries:
            seen_max[d.partition] = max(seen_max.get(d.partition, -1), d.offset)
    positions = committed(stack)
    with CommitWatch(stack) as watch:
        new = tool_reset(stack, "--to-earliest", "--topic", stack.topic)
        ended = time.monotonic()
        assert new == dict.fromkeys(range(PARTITIONS), 0)

        def restored() -> bool:
            now = committed(stack)
            return all(now[p][0] >= positions[p][0] > 0 for p in range(PARTITIONS))

        wait_for(restored, REVERT_SECONDS, "the mesh's positions committed again")
        took = time.monotonic() - ended
        time.sleep(1.0)
    print(f"reverted within {took:.2f} s of the tool's exit; positions before {positions}")
    zeros = sorted({(round(at - ended, 2), p) for at, sample in watch.samples if at > ended
                    for p, (offset, _) in sample.items() if offset < positions[p][0]})  # fmt: skip
    print(f"samples (every 50 ms) showing an offset below the mesh's after the exit: {zeros}")
    with stack.tally.lock:
        rewinds = [
            (d.partition, d.offset)
            for d in stack.tally.deliveries
            if d.fetched_at > ended and d.offset <= seen_max.get(d.partition, -1)
        ]
    assert rewinds == [], f"the client saw a rewind: {rewinds[:10]}"
    assert leases(stack) == before_leases, "a revert keeps every lease's holder and epoch"
    assert stack.loop.alive and stack.loop.errors == [], "the client saw an error"
    assert stack.client.endpoints == before_endpoints and rebinds(stack) == before_rebinds
    after = committed(stack)
    assert all(after[p][1] == before_leases[p][1] for p in range(PARTITIONS)), after
    # dsctl describe names the holder as the last committer again (issue 23 item 5).
    described = ok_json(dsctl(stack, "describe", stack.group, "-o", "json"))
    writers = {p["partition"]: p["committed_by"] for p in described["partitions"]}
    print(f"dsctl describe, committed by: {writers}")
    assert writers == {p: f"{h} (epoch {e})" for p, (h, e) in before_leases.items()}, writers


def test_audited_as_reverted_and_nothing_lost(stack: Stack) -> None:
    def audited() -> list[dict[str, Any]] | None:
        doc = ok_json(dsctl(stack, "faults", "--group", stack.group, "--type", "OFFSETS_RESET",
                            "-o", "json"))  # fmt: skip
        events = [f for f in doc["faults"] if f["state"] == "OPEN"]
        parts = {
            int(x.split(":")[0]) for e in events for x in e["attributes"]["offsets"].split(",")
        }
        return events if parts >= set(range(PARTITIONS)) else None

    events = wait_for(audited, 60, "OFFSETS_RESET events naming every partition")
    time.sleep(4.0)  # the commit log's grace in revert mode (3 s): no second record
    events = audited() or []
    print(json.dumps(events, indent=2))
    named = [int(x.split(":")[0]) for e in events for x in e["attributes"]["offsets"].split(",")]
    assert sorted(named) == list(range(PARTITIONS)), f"each revert recorded once: {named}"
    for e in events:
        attributes = e["attributes"]
        assert (attributes["source"], attributes["action"]) == ("external", "reverted"), e
        assert "no commit metadata" in attributes["actor"] and attributes["detected_by"]
        assert "reverted" in e["message"]
        for part in attributes["offsets"].split(","):
            external, restored = (int(x) for x in part.split(":")[1].split("->"))
            assert external == 0 < restored, part

    confirmed = stack.producer.confirmed()
    wait_for(lambda: not (confirmed - stack.tally.received()), 60, "every record")
    print(
        f"external reset reverted: produced {len(confirmed)}, received "
        f"{len(stack.tally.received())}, lost {len(confirmed - stack.tally.received())}, "
        f"delivered again {stack.tally.duplicate_count()}, client errors {stack.loop.errors}"
    )
    assert stack.tally.duplicate_count() == 0, "a revert delivers nothing again"
