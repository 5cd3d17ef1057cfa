"""``dsctl mode`` on the real mesh: leased → kafka_group → leased with a producer running and
a client reading (issue 16, item 4).

Two sidecars serve the group; a producer writes 200 records/s and a ``DsClient`` fetches
and acks throughout, every delivery recorded. Each switch hands every partition over once
(in-flight acks drained, acked offsets committed), so nothing is lost and a record is
delivered twice only if its first delivery's ack was refused or failed (counted); the
sidecars keep running and the client stays bound. In kafka_group mode the Kafka group has
both sidecars as static members and an executed offset reset is refused (GROUP_NOT_EMPTY);
back in leased mode Kafka's group is empty again and leases hold every partition.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from dsclient import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from tests.support.group_modes import GroupSpec, describe_kafka_group, start_assigner
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.ops import (
    dsctl,
    ok_json,
    unexplained_duplicates,
)
from tests.support.records import ConsumerLoop, SeqProducer, Tally
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 6
SIDECARS = ("sidecar-a", "sidecar-b")
GROUP_CONFIG = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


def leased_and_held(assigner: ServiceProcess, group: str) -> bool:
    doc = ok_json(dsctl(assigner.grpc_addr, "describe", group, "-o", "json"))
    return doc["config"]["mode"] == "leased" and all(
        le["holder"] in SIDECARS and le["state"] == "granted" for le in doc["leases"]
    )


def progress(tally: Tally, past: int, timeout: float = 60) -> None:
    """The client keeps receiving: ``past`` more records than now."""
    target = len(tally.received()) + past
    wait_for(lambda: len(tally.received()) >= target, timeout, f"{past} more records")


def test_switch_leased_to_kafka_group_and_back_with_a_client_reading(
    kafka_cluster: KafkaHandle, tmp_path: Path
) -> None:
    topics = TopicFactory(kafka_cluster.bootstrap, "mode-switch")
    topic = topics(PARTITIONS)
    group = f"switch-{uuid.uuid4().hex[:8]}"
    producer = SeqProducer(kafka_cluster.bootstrap, topic, PARTITIONS, rate=200.0).start()
    try:
        with running_mesh(kafka_cluster.bootstrap, tmp_path) as mesh:
            assigner = start_assigner(mesh, [GroupSpec(group, [topic], "leased", GROUP_CONFIG)])
            assigner.wait_serving(90)
            sidecars = [mesh.sidecar(group, assigner, sid) for sid in SIDECARS]
            for svc in sidecars:
                svc.wait_serving(90)
            wait_for(lambda: leased_and_held(assigner, group), 90, "leases held", every=0.5)
            with DsClient(group, client_id="switch-app", assigner=assigner.grpc_addr) as client:
                tally = Tally()
                loop = ConsumerLoop(client, tally).start()
                progress(tally, 1000)
                endpoints = client.endpoints

                switched = ok_json(dsctl(assigner.grpc_addr, "mode", group, "kafka_group",
                                         "--yes", "-o", "json"))  # fmt: skip
                print(json.dumps(switched))
                assert (switched["mode_before"], switched["mode"]) == ("leased", "kafka_group")
                members = wait_for(
                    lambda: describe_kafka_group(kafka_cluster.bootstrap, group).members,
                    60, "both sidecars in Kafka's group",
                )  # fmt: skip
                wait_for(
                    lambda: sorted(
                        m.group_instance_id or ""
                        for m in describe_kafka_group(kafka_cluster.bootstrap, group).members
                    ) == list(SIDECARS),
                    60, "both sidecars static members of Kafka's group",
                )  # fmt: skip
                assert members
                progress(tally, 1000)
                with tally.lock:
                    assert any(d.epoch == 0 for d in tally.deliveries[-200:]), "kafka_group"

                refused = dsctl(assigner.grpc_addr, "offsets", "reset", group, "--to-earliest",
                                "--execute", "--yes")  # fmt: skip
                print(refused.stderr)
                assert refused.returncode == 1 and "GROUP_NOT_EMPTY" in refused.stderr

                back = ok_json(dsctl(assigner.grpc_addr, "mode", group, "leased", "--yes",
                                     "-o", "json"))  # fmt: skip
                print(json.dumps(back))
                assert (back["mode_before"], back["mode"]) == ("kafka_group", "leased")
                assert describe_kafka_group(kafka_cluster.bootstrap, group).members == []
                wait_for(lambda: leased_and_held(assigner, group), 30, "leases held again")
                progress(tally, 1000)
                with tally.lock:
                    assert all(d.epoch > 0 for d in tally.deliveries[-200:]), "leased again"

                confirmed = producer.stop()
                wait_for(lambda: not (confirmed - tally.received()), 60, "every record")
                loop.stop()
                duplicates = tally.duplicate_count()
                print(
                    f"mode switch leased -> kafka_group -> leased: produced {len(confirmed)}, "
                    f"received {len(tally.received())}, lost {len(confirmed - tally.received())}"
                    f", duplicates {duplicates} (all of records whose earlier ack was refused or "
                    f"failed: unexplained {len(unexplained_duplicates(tally))}), partial acks "
                    f"{loop.partial_acks}, client errors {loop.errors}"
                )
                assert loop.errors == []
                assert client.endpoints == endpoints, "the client stayed bound to both"
                assert unexplained_duplicates(tally) == {}
            for svc in sidecars:
                assert svc.proc is not None and svc.proc.poll() is None, "sidecars kept running"
    finally:
        producer.stop()
        topics.delete_all()
