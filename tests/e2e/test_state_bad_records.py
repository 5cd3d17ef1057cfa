"""Garbage written by hand into the assigner's state topic: a restarted assigner still
loads, leads and serves, the bad records counted and skipped, none of them applied.

The records are what the issue found would stop an assigner or corrupt its state: a key
that is not JSON or names no kind, a group key whose value is not JSON or lacks
fields, and a ``null`` value under an epoch key (which let an epoch go back to nothing).
(A ``null`` under a group key is no longer garbage: it is how ``DeleteGroup`` records a
deletion, issue 40, tested with it in ``tests/integration/test_delete_group.py``.) The
test's assigner has a state topic of its own, so other tests' assigners never read them.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Callable

import grpc
import pytest
from confluent_kafka import Producer

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

PARTITIONS = 4


def describe(svc: ServiceProcess, group: str) -> admin_pb2.DescribeGroupResponse:
    stub = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(svc.grpc_addr))
    response: admin_pb2.DescribeGroupResponse = stub.DescribeGroup(
        admin_pb2.DescribeGroupRequest(group=group), timeout=10
    )
    return response


def held(svc: ServiceProcess, group: str) -> dict[tuple[str, int], tuple[str, int]] | None:
    """(topic, partition) -> (holder, epoch) once every partition is held, else None."""
    try:
        leases = describe(svc, group).leases
    except grpc.RpcError:
        return None
    current = {(x.topic, x.partition): (x.holder, x.epoch) for x in leases}
    if len(current) == PARTITIONS and all(h for h, _e in current.values()):
        return current
    return None


def bad_records_metric(svc: ServiceProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{svc.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ds_assigner_state_bad_records_total{"):
            series, _, value = line.rpartition(" ")
            out[series.split('kind="')[1].split('"')[0]] = float(value)
    return out


def key(*parts: object) -> bytes:
    return json.dumps(list(parts), separators=(",", ":")).encode()


def test_assigner_leads_after_garbage_in_its_state_topic(
    mesh: Mesh, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    state_topic = f"__ds_assigner_state.test-{uuid.uuid4().hex[:8]}"
    env = {"DS_STATE_TOPIC": state_topic}
    assigner = mesh.assigner([(group, [topic])], env=env)
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "sc-0")
    sidecar.wait_serving()
    before = wait_for(lambda: held(assigner, group), 30, "every partition held")

    producer = Producer({"bootstrap.servers": mesh.bootstrap, "enable.idempotence": True})
    # (A record without a key cannot be written: Kafka refuses one on a compacted topic.)
    garbage: list[tuple[bytes, bytes | None]] = [
        (b"\x00\xff garbage", b"\xfe\xff"),  # a key that is not JSON
        (b"[]", b"{}"),  # JSON, but no kind
        (key("group", group), b"this is not json"),
        (key("group", group), json.dumps({"name": group}).encode()),  # lacks topics
        (key("epoch", group, topic, 0), None),  # would take the epoch back to none
    ]
    failed: list[str] = []
    for record_key, value in garbage:
        producer.produce(
            state_topic,
            key=record_key,
            value=value,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
    assert producer.flush(30) == 0
    assert failed == [], "Kafka took every record"

    assigner.kill()
    mesh.services.remove(assigner)
    assigner = ServiceProcess(
        assigner.kind, assigner.args, assigner.log, assigner.grpc_port, assigner.http_port, env
    ).start()
    mesh.services.append(assigner)
    assigner.wait_serving(timeout=60)  # it loaded the topic and leads

    assert bad_records_metric(assigner) == {"unknown": 2.0, "group": 2.0, "epoch": 1.0}
    config = describe(assigner, group).config
    assert list(config.topics) == [topic], "the group's durable record is unchanged"
    # The sidecar re-attaches with its leases; they are kept at their epochs (partition 0's
    # epoch too: the tombstone was not applied, so its grant stays fenced by it).
    after = wait_for(lambda: held(assigner, group), 30, "every partition held again")
    assert after == before
    assert "skipping a state record that does not parse" in assigner.tail(400)
