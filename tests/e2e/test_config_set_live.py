"""``dsctl config set`` on the real mesh (issue 16, item 1): a group's consumer config
applied live while a producer runs and a ``DsClient`` fetches and acks, every record counted.

Leased mode, three sidecars (one, ``sc-odd``, runs with its own ``message.max.bytes`` of
5 MB, so a group ``fetch.max.bytes`` below that cannot be built there):

* ``fetch.max.bytes`` (then ``isolation.level`` + ``client.rack``, the properties the issue
  names as needing a new consumer; librdkafka changes none on a running client, so both
  take one): every sidecar's ``Status`` shows the new version within 2 s of the update,
  running the new values; no lease epoch changes;
* a key off the allow-list: ``dsctl`` exits 1 naming it, and so does ``UpdateGroup``
  itself; the version stays;
* a value ``sc-odd`` cannot run: ``dsctl`` exits 5 naming it and the reason, the other two
  run it, ``sc-odd`` keeps its previous config, and ``CONFIG_REJECTED`` is published on
  ``ds.faults``; the next version it can run resolves it;
* in the end: every produced record received, none twice, each partition in order.

kafka_group mode, two sidecars: the same change rejoins each sidecar under its static id;
every record is received, and a record is delivered twice only if its first delivery's ack
was not accepted (at-least-once), counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient import DsClient
from dsclient.reasons import error_info
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.assignment import wait_stable
from tests.support.group_modes import GroupSpec, start_assigner
from tests.support.mesh import REPO, Mesh, ServiceProcess
from tests.support.notifier import FAULTS_TOPIC, TopicReader, events, start_notifier
from tests.support.ops import dsctl
from tests.support.records import (
    ConsumerLoop,
    SeqProducer,
    Tally,
    describe_missing,
    wait_received,
)
from tests.support.sidecar_probe import kafka_config_file, status
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6
RATE = 300.0
APPLY_WITHIN = 2.0  # seconds: the bound for every sidecar to run a new version
ODD_MESSAGE_MAX = "5000000"  # sc-odd's own librdkafka setting


def describe(assigner: str, group: str) -> admin_pb2.DescribeGroupResponse:
    with grpc.insecure_channel(assigner) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=10)


def epochs(assigner: str, group: str) -> dict[int, tuple[str, int]]:
    return {le.partition: (le.holder, le.epoch) for le in describe(assigner, group).leases}


class Applying:
    """``dsctl config set`` in the background while this watches the group's version (when
    the update is stored) and every sidecar's ``Status`` (when each runs it)."""

    def __init__(self, assigner: str, group: str, sidecars: dict[str, ServiceProcess]) -> None:
        self.assigner, self.group, self.sidecars = assigner, group, sidecars

    def run(self, *args: str, expect: set[str] | None = None) -> tuple[Any, dict[str, float]]:
        """Runs ``dsctl config set GROUP ARGS --yes -o json``; returns its JSON document
        and, for each sidecar in ``expect`` (default all), the seconds from the update being
        stored to its Status showing the new version."""
        before = describe(self.assigner, self.group).config.config_version
        expect = set(self.sidecars) if expect is None else expect
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.dsctl", "config", "set", self.group, *args,
             "--yes", "--output", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "DS_ASSIGNER": self.assigner},
        )  # fmt: skip

        def stored() -> float | None:
            if describe(self.assigner, self.group).config.config_version > before:
                return time.monotonic()
            if proc.poll() is not None:  # dsctl ended and nothing was stored: say why
                out, err = proc.communicate()
                raise AssertionError(f"dsctl exited {proc.returncode}: {out} {err}")
            return None

        try:
            stored_at = wait_for(stored, 30, "the update to be stored", every=0.02)
        except AssertionError as timed_out:
            if proc.poll() is None:
                proc.kill()
                out, err = proc.communicate()
                raise AssertionError(f"not stored in 30 s; dsctl: {out} {err}") from timed_out
            raise
        version = before + 1
        running: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while set(running) != expect and time.monotonic() < deadline:
            for sid in expect - set(running):
                if status(self.sidecars[sid].grpc_addr).config_version >= version:
                    running[sid] = time.monotonic() - stored_at
            time.sleep(0.02)
        out, err = proc.communicate(timeout=60)
        self.last = (proc.returncode, out, err)
        return (json.loads(out) if out.strip() else None), running


def out_of_order(tally: Tally) -> list[str]:
    """Deliveries whose offset is not above the partition's previous first delivery."""
    last: dict[int, int] = defaultdict(lambda: -1)
    seen: set[tuple[int, int]] = set()
    problems = []
    with tally.lock:
        for d in tally.deliveries:
            if (d.partition, d.offset) in seen:
                continue  # a redelivery: counted as a duplicate, not as disorder
            seen.add((d.partition, d.offset))
            if d.offset <= last[d.partition]:
                problems.append(f"p{d.partition}@{d.offset} after @{last[d.partition]}")
            last[d.partition] = max(last[d.partition], d.offset)
    return problems


def finish(
    producer: SeqProducer, tally: Tally, loop: ConsumerLoop, client: DsClient
) -> tuple[set[int], set[int]]:
    try:
        produced = producer.stop()
        missing = wait_received(tally, produced, timeout=60)
        time.sleep(1.5)  # anything delivered twice shows up here
    finally:
        loop.stop()
        client.close()
    return produced, missing


def test_config_set_applies_live_in_leased_mode_and_a_refusal_keeps_the_old_config(
    mesh: Mesh, topic_factory: TopicFactory, kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"live-{uuid.uuid4().hex[:8]}"
    notifier = start_notifier(mesh, tmp_path / "outbox.sqlite")
    to_notifier = ("--notifier", notifier.grpc_addr)
    assigner = mesh.assigner([(group, [topic])], *to_notifier)
    odd_config = kafka_config_file(tmp_path / "odd.yaml", {"message.max.bytes": ODD_MESSAGE_MAX})
    sidecars = {
        "sc-a": mesh.sidecar(group, assigner, "sc-a", *to_notifier),
        "sc-b": mesh.sidecar(group, assigner, "sc-b", *to_notifier),
        "sc-odd": mesh.sidecar(group, assigner, "sc-odd", *to_notifier, "--config", odd_config),
    }
    for svc in (notifier, assigner, *sidecars.values()):
        svc.wait_serving(90)
    wait_stable(assigner.grpc_addr, group, list(sidecars), PARTITIONS)
    leases_before = epochs(assigner.grpc_addr, group)
    faults = TopicReader(kafka_cluster.bootstrap, FAULTS_TOPIC, from_end=True)
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=RATE).start()
    tally = Tally()
    client = DsClient(group, client_id="live-config-app", assigner=assigner.grpc_addr)
    loop = ConsumerLoop(client, tally, max_records=200).start()
    applying = Applying(assigner.grpc_addr, group, sidecars)
    try:
        time.sleep(3)
        # 1. fetch.max.bytes, then isolation.level + client.rack.
        for args, values in (
            (["fetch.max.bytes=16777216"], {"fetch.max.bytes": "16777216"}),
            (
                ["isolation.level=read_uncommitted", "client.rack=rack-a"],
                {"isolation.level": "read_uncommitted", "client.rack": "rack-a"},
            ),
        ):
            doc, running = applying.run(*args)
            code, _, err = applying.last
            print(f"dsctl config set {' '.join(args)}: exit {code}; running after {running}")
            assert code == 0, err
            assert doc["applied"] and doc["changes"]["new_consumer"]
            assert all(m["state"] == "applied" for m in doc["members"])
            assert set(running) == set(sidecars)
            assert max(running.values()) <= APPLY_WITHIN, running
            for svc in sidecars.values():
                shown = status(svc.grpc_addr)
                assert shown.config_version == doc["config_version"]
                for key, value in values.items():
                    assert shown.consumer_config[key] == value, (svc.log.stem, key)
            time.sleep(2)

        # 2. A key off the allow-list: refused by dsctl and by the assigner; nothing changes.
        version = describe(assigner.grpc_addr, group).config.config_version
        refused = dsctl(assigner.grpc_addr, "config", "set", group, "bootstrap.servers=evil:9092",
                        "--yes")  # fmt: skip
        print(f"dsctl config set bootstrap.servers=evil:9092: exit {refused.returncode}: "
              f"{refused.stderr.strip()}")  # fmt: skip
        assert refused.returncode == 1 and "bootstrap.servers" in refused.stderr
        with (
            grpc.insecure_channel(assigner.grpc_addr) as channel,
            pytest.raises(grpc.RpcError) as excinfo,
        ):
            admin_pb2_grpc.AdminServiceStub(channel).UpdateGroup(
                admin_pb2.UpdateGroupRequest(
                    group=types_pb2.GroupConfig(
                        name=group, consumer_config={"bootstrap.servers": "evil:9092"}
                    ),
                    update_mask=field_mask_pb2.FieldMask(paths=["consumer_config"]),
                ),
                timeout=10,
            )
        info = error_info(excinfo.value)
        assert excinfo.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert info is not None and info.metadata["key"] == "bootstrap.servers"
        assert describe(assigner.grpc_addr, group).config.config_version == version
        assert {status(s.grpc_addr).config_version for s in sidecars.values()} == {version}

        # 3. A value sc-odd cannot build: the others run it, sc-odd keeps its config.
        doc, running = applying.run("fetch.max.bytes=4194304", expect={"sc-a", "sc-b"})
        code, _, err = applying.last
        print(f"dsctl config set fetch.max.bytes=4194304: exit {code}: {err.strip()}")
        assert code == 5 and "sc-odd refused it" in err
        states = {m["sidecar_id"]: m for m in doc["members"]}
        assert states["sc-odd"]["state"] == "refused"
        assert "`fetch.max.bytes` must be >= `message.max.bytes`" in states["sc-odd"]["reason"]
        assert states["sc-a"]["state"] == states["sc-b"]["state"] == "applied"
        assert max(running.values()) <= APPLY_WITHIN, running
        odd = status(sidecars["sc-odd"].grpc_addr)
        assert odd.config_version == version
        assert odd.consumer_config["fetch.max.bytes"] == "16777216"

        def rejected(state: int) -> list[common_pb2.FaultEvent]:
            return [
                e
                for e in events(faults.messages)
                if e.group == group
                and e.type == common_pb2.FAULT_TYPE_CONFIG_REJECTED
                and e.state == state
            ]

        opened = faults.wait(
            lambda _m: rejected(common_pb2.FAULT_STATE_OPEN), 30, "CONFIG_REJECTED on ds.faults"
        )[0]
        print(f"on {FAULTS_TOPIC}: {opened.message}")
        assert opened.consumer_id == "sc-odd" and opened.source_service == "assigner"
        assert opened.attributes["config_version"] == str(version + 1)
        assert opened.attributes["running_version"] == str(version)

        # 4. A version sc-odd can run: every member runs it; the fault resolves.
        doc, running = applying.run("fetch.max.bytes=8388608")
        assert applying.last[0] == 0 and doc["applied"]
        assert max(running.values()) <= APPLY_WITHIN, running
        resolved = faults.wait(
            lambda _m: rejected(common_pb2.FAULT_STATE_RESOLVED), 30, "CONFIG_REJECTED resolved"
        )[0]
        assert resolved.dedupe_key == opened.dedupe_key
        time.sleep(2)
        assert epochs(assigner.grpc_addr, group) == leases_before, "a lease changed"
    finally:
        faults.close()
        produced, missing = finish(producer, tally, loop, client)

    disorder = out_of_order(tally)
    print(
        f"produced {len(produced)}, received {len(tally.received())}, lost {len(missing)}, "
        f"duplicates {tally.duplicate_count()}, out of order {len(disorder)}, "
        f"partial acks {loop.partial_acks}"
    )
    assert not loop.errors, f"the application saw errors: {loop.errors!r}"
    assert not missing, describe_missing(missing, PARTITIONS, producer=producer, tally=tally)
    assert tally.duplicate_count() == 0, sorted(tally.duplicates())[:10]
    assert not disorder, disorder[:10]


def test_config_set_in_kafka_group_mode_rejoins_under_the_static_id(
    mesh: Mesh, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"live-kg-{uuid.uuid4().hex[:8]}"
    spec = GroupSpec(group, [topic], mode="kafka_group",
                     consumer_config={"session.timeout.ms": "10000"})  # fmt: skip
    assigner = start_assigner(mesh, [spec])
    sidecars = {sid: mesh.sidecar(group, assigner, sid) for sid in ("kg-a", "kg-b")}
    for svc in (assigner, *sidecars.values()):
        svc.wait_serving(90)
    wait_for(
        lambda: (
            sum(len(status(s.grpc_addr).partitions) for s in sidecars.values()) == PARTITIONS
            and all(status(s.grpc_addr).partitions for s in sidecars.values())
        ),
        60,
        "Kafka to assign every partition over both sidecars",
    )
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=RATE).start()
    tally = Tally()
    client = DsClient(group, client_id="live-config-kg", assigner=assigner.grpc_addr)
    loop = ConsumerLoop(client, tally, max_records=200).start()
    applying = Applying(assigner.grpc_addr, group, sidecars)
    try:
        time.sleep(3)
        doc, running = applying.run("fetch.max.bytes=16777216", "isolation.level=read_uncommitted")
        code, _, err = applying.last
        print(f"kafka_group: dsctl config set: exit {code}; running after {running}")
        assert code == 0, err
        assert doc["applied"] and doc["mode"] == "kafka_group"
        assert max(running.values()) <= APPLY_WITHIN, running
        for svc in sidecars.values():
            assert status(svc.grpc_addr).consumer_config["fetch.max.bytes"] == "16777216"
        wait_for(
            lambda: (
                sum(len(status(s.grpc_addr).partitions) for s in sidecars.values()) == PARTITIONS
            ),
            30,
            "every partition assigned again",
        )
        time.sleep(3)
    finally:
        produced, missing = finish(producer, tally, loop, client)

    duplicates = tally.duplicates()
    unexplained = explain_duplicates(duplicates.values())
    print(
        f"kafka_group: produced {len(produced)}, received {len(tally.received())}, "
        f"lost {len(missing)}, duplicates {tally.duplicate_count()} "
        f"({len(unexplained)} after an accepted ack), out of order {len(out_of_order(tally))}"
    )
    assert not loop.errors, f"the application saw errors: {loop.errors!r}"
    assert not missing, describe_missing(missing, PARTITIONS, producer=producer, tally=tally)
    assert not unexplained, unexplained[:10]
    assert not out_of_order(tally)


def explain_duplicates(duplicates: Sequence[Sequence[Any]]) -> list[str]:
    """Duplicates whose first delivery's ack was accepted: at-least-once allows a record
    again only when its ack was not (it was in flight when its partition was handed back)."""
    return [
        f"seq {ds[0].seq} (p{ds[0].partition}@{ds[0].offset})" for ds in duplicates if ds[0].acked
    ]
