"""dsctl's read commands on the real mesh (issue 6, item 6).

One mesh for the module: a notifier, an assigner reporting to it, two sidecars serving a
group on a 4-partition topic with 400 records of which about 150 are consumed and acked
by a bound application client. The real ``dsctl`` runs as a subprocess against it:

* ``dsctl lag GROUP --output json`` equals Kafka's own answer (AdminClient
  ``list_consumer_group_offsets`` and ``list_offsets(OffsetSpec.latest)``);
* groups / describe / bindings / top / faults print JSON with the expected entities;
* unknown group → exit 2, unreachable assigner or notifier → exit 3, lag over --max-lag
  → exit 4, each with a clear message and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from services.devstack.ports import free_port
from tests.support import cli
from tests.support.mesh import REPO, ServiceProcess, running_mesh
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 4
RECORDS = 400
CONSUME_FIRST = 150
# A held lease: today's assigner reports GRANTED for held leases (it never says ACTIVE).
HELD = (types_pb2.LEASE_STATE_GRANTED, types_pb2.LEASE_STATE_ACTIVE)


@dataclass
class Stack:
    bootstrap: str
    topic: str
    group: str
    assigner: ServiceProcess
    notifier: ServiceProcess
    sidecars: dict[str, ServiceProcess]
    client: DsClient
    client_id: str


def dsctl(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return cli.dsctl(*args, env=dsctl_env(stack), timeout=timeout)


def dsctl_env(stack: Stack) -> dict[str, str]:
    return {
        **os.environ,
        "DS_ASSIGNER": stack.assigner.grpc_addr,
        "DS_NOTIFIER": stack.notifier.grpc_addr,
        "COLUMNS": "200",
    }


def json_of(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def kafka_offsets(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int | None, int]]:
    """partition → (committed or None, end offset), straight from the broker."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])
    committed = {
        tp.partition: (tp.offset if tp.offset >= 0 else None)
        for tp in listed[group].result(timeout=10).topic_partitions
    }
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=10)
    return {tp.partition: (committed[tp.partition], f.result().offset) for tp, f in ends.items()}


def settled_kafka_offsets(stack: Stack) -> dict[int, tuple[int | None, int]]:
    """Kafka's view once the sidecars' commits of our acks have landed (two equal reads)."""
    previous = kafka_offsets(stack.bootstrap, stack.group, stack.topic)
    for _ in range(30):
        time.sleep(1.5)
        current = kafka_offsets(stack.bootstrap, stack.group, stack.topic)
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"committed offsets never settled: {previous}")


def consume(client: DsClient, count: int) -> int:
    """Fetch and ack ``count`` records; returns how many were acked."""
    acked = 0
    deadline = time.monotonic() + 60
    while acked < count and time.monotonic() < deadline:
        batch = client.fetch(max_records=min(50, count - acked), max_wait=1.0)
        if batch:
            assert client.ack(batch) == len(batch)
            acked += len(batch)
    assert acked == count
    return acked


def leases_settled(stub: admin_pb2_grpc.AdminServiceStub, group: str, seen: list[str]) -> bool:
    """Two members holding two partitions each; ``seen`` keeps the last answer for the
    failure message."""
    try:
        described = stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=20)
    except grpc.RpcError as err:
        seen[:] = [f"DescribeGroup: {err.code()} {err.details()}"]  # type: ignore[attr-defined]
        return False
    holders = [lease.holder for lease in described.leases]
    seen[:] = [f"holders {holders}, states {[lease.state for lease in described.leases]}"]
    return (
        len(described.members) == 2
        and sorted(holders.count(m.sidecar_id) for m in described.members) == [2, 2]
        and all(lease.state in HELD for lease in described.leases)
    )


@pytest.fixture(scope="module")
def stack(kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    topics = TopicFactory(kafka_cluster.bootstrap, "dsctl-read")
    topic = topics(PARTITIONS)
    group = f"demo-{uuid.uuid4().hex[:8]}"
    log_dir: Path = tmp_path_factory.mktemp("dsctl-read")
    try:
        with running_mesh(kafka_cluster.bootstrap, log_dir) as mesh:
            notifier = mesh.service("notifier")
            assigner = mesh.assigner([(group, [topic])], "--notifier", notifier.grpc_addr)
            notifier.wait_serving(90)
            assigner.wait_serving(90)
            producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
            for seq in range(RECORDS):
                producer.produce(topic, key=b"%d" % seq, value=b"v", partition=seq % PARTITIONS)
            assert producer.flush(30) == 0
            sidecars = {
                sid: mesh.sidecar(group, assigner, sid, "--notifier", notifier.grpc_addr)
                for sid in ("sidecar-a", "sidecar-b")
            }
            for svc in sidecars.values():
                svc.wait_serving(90)
            with grpc.insecure_channel(assigner.grpc_addr) as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                # On a fresh broker the first offsets read waits for __consumer_offsets.
                seen: list[str] = []
                try:
                    wait_for(lambda: leases_settled(stub, group, seen), 180, "2 + 2 leases")
                except AssertionError as err:
                    raise AssertionError(f"{err}; last answer: {seen}") from None
            client_id = "dsctl-e2e"
            with DsClient(group, client_id=client_id, assigner=assigner.grpc_addr) as client:
                wait_for(lambda: len(client.endpoints) == 2, 30, "client bound to both")
                consume(client, CONSUME_FIRST)
                yield Stack(
                    kafka_cluster.bootstrap, topic, group, assigner, notifier, sidecars,
                    client, client_id,
                )  # fmt: skip
    finally:
        topics.delete_all()


def test_lag_json_equals_kafka_offsets(stack: Stack) -> None:
    expected = settled_kafka_offsets(stack)
    assert sum(end for _, end in expected.values()) == RECORDS
    assert sum(c or 0 for c, _ in expected.values()) >= CONSUME_FIRST

    def lag_with_ages() -> dict[str, Any] | None:
        # lag_seconds comes from a probe the assigner runs in the background: null until
        # it answered for every lagging partition.
        doc: dict[str, Any] = json_of(dsctl(stack, "lag", stack.group, "--output", "json"))
        group = doc["groups"][0]
        return doc if group["max_lag_seconds"] is not None else None

    doc = wait_for(lag_with_ages, 30, "lag_seconds known for every partition")
    print(json.dumps(doc, indent=2))
    [group] = doc["groups"]
    assert group["group"] == stack.group
    got = {p["partition"]: (p["committed"], p["end"]) for p in group["partitions"]}
    assert got == expected
    for p in group["partitions"]:
        assert p["topic"] == stack.topic
        assert p["lag_records"] == p["end"] - (p["committed"] or 0)
        assert (p["lag_seconds"] > 0) if p["lag_records"] else (p["lag_seconds"] == 0)
    assert group["total_lag"] == sum(end - (c or 0) for c, end in expected.values()) > 0

    # All groups when GROUP is omitted: ours is among them with the same figures.
    everything = json_of(dsctl(stack, "lag", "-o", "json"))
    ours = next(g for g in everything["groups"] if g["group"] == stack.group)
    assert {p["partition"]: (p["committed"], p["end"]) for p in ours["partitions"]} == expected

    # Thresholds for scripts: over → exit 4 naming the group; under → 0.
    over = dsctl(stack, "lag", stack.group, "-o", "json", "--max-lag", "0")
    assert over.returncode == 4, over.stderr
    assert stack.group in over.stderr and json.loads(over.stdout)["groups"][0]["total_lag"] > 0
    assert dsctl(stack, "lag", stack.group, "--max-lag", str(RECORDS)).returncode == 0


def test_lag_watch_prints_one_document_per_refresh(stack: Stack) -> None:
    result = dsctl(
        stack, "lag", stack.group, "--watch", "--count", "2", "--interval", "0.5", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    docs = [json.loads(line) for line in lines]
    assert docs[0]["time"] < docs[1]["time"]
    for doc in docs:
        assert [g["group"] for g in doc["groups"]] == [stack.group]
        assert len(doc["groups"][0]["partitions"]) == PARTITIONS


def test_groups_describe_and_bindings(stack: Stack) -> None:
    groups = json_of(dsctl(stack, "groups", "-o", "json"))["groups"]
    ours = next(g for g in groups if g["name"] == stack.group)
    assert ours["mode"] == "leased" and ours["topics"] == [stack.topic]
    assert (ours["members"], ours["partitions"]) == (2, PARTITIONS)
    assert ours["total_lag"] is not None and ours["total_lag"] > 0

    doc = json_of(dsctl(stack, "describe", stack.group, "-o", "json"))
    assert doc["group"] == stack.group and doc["config"]["topics"] == [stack.topic]
    assert doc["config"]["config_version"] >= 1
    endpoints = {sid: svc.grpc_addr for sid, svc in stack.sidecars.items()}
    assert {m["sidecar_id"]: m["endpoint"] for m in doc["members"]} == endpoints
    assert all(m["last_heartbeat"] for m in doc["members"])
    leases = doc["leases"]
    assert sorted(lease["partition"] for lease in leases) == list(range(PARTITIONS))
    for lease in leases:
        assert lease["holder"] in endpoints and lease["epoch"] >= 1
        assert lease["state"] in ("granted", "active") and lease["expires_at"]
    assert len(doc["partitions"]) == PARTITIONS
    [binding] = doc["bindings"]
    assert binding["client_id"] == stack.client_id
    assert {e["address"] for e in binding["endpoints"]} == set(endpoints.values())
    served = sorted(tp["partition"] for e in binding["endpoints"] for tp in e["partitions"])
    assert served == list(range(PARTITIONS))

    for args in (("bindings", stack.group), ("bindings",)):
        listed = json_of(dsctl(stack, *args, "-o", "json"))["bindings"]
        assert [b for b in listed if b["group"] == stack.group] == doc["bindings"]

    # The table view shows the same entities.
    table = dsctl(stack, "describe", stack.group)
    assert table.returncode == 0, table.stderr
    for text in (stack.group, stack.topic, "sidecar-a", "sidecar-b", stack.client_id):
        assert text in table.stdout


def test_top_rates_count_what_was_acked(stack: Stack) -> None:
    settled_kafka_offsets(stack)  # nothing in flight from earlier acks
    refreshes = 8
    top = subprocess.Popen(
        [sys.executable, "-m", "services.dsctl", "top", "--group", stack.group,
         "--interval", "2", "--count", str(refreshes), "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=dsctl_env(stack),
    )  # fmt: skip
    assert top.stdout is not None and top.stderr is not None
    docs = []
    try:
        docs.append(json.loads(top.stdout.readline()))
        # Acked after the first refresh; each ack is committed before it is answered, so
        # the refreshes that follow see all of it, however the acks and the refreshes
        # interleave on a busy machine: the records counted over them add up to `acked`.
        acked = consume(stack.client, 40)
        counted = 0.0
        while len(docs) < refreshes and round(counted) < acked:
            docs.append(json.loads(top.stdout.readline()))
            counted += docs[-1]["groups"][0]["records_per_second"] * docs[-1]["interval_seconds"]
    finally:
        top.kill()
        top.wait(30)
    for doc in docs:
        [group] = doc["groups"]
        assert group["group"] == stack.group
        assert (group["members"], group["partitions"], group["unassigned"]) == (2, 4, 0)
        assert group["imbalance"] == 1.0 and group["balanced"] is True
        rows = {s["sidecar_id"]: s for s in group["sidecars"]}
        assert set(rows) == set(stack.sidecars)
        assert all(s["partitions"] == 2 for s in rows.values())
        assert {s["sidecar_id"] for s in doc["sidecars"]} == set(stack.sidecars)
        assert group["records_per_second"] == pytest.approx(
            sum(s["records_per_second"] for s in group["sidecars"]), abs=0.01
        )
    assert docs[0]["groups"][0]["records_per_second"] == 0  # nothing consumed meanwhile
    assert abs(counted - acked) < 0.5, f"top counted {counted:.1f} records, {acked} were acked"


def report(stack: Stack, message: str) -> str:
    event = common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_CLIENT_BACKPRESSURE,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_WARNING,
        source_service="sidecar",
        source_instance="sidecar-a",
        group=stack.group,
        client_id=stack.client_id,
        message=message,
        dedupe_key=f"dsctl-e2e-{uuid.uuid4()}",  # never suppressed as a duplicate
    )
    with grpc.insecure_channel(stack.notifier.grpc_addr) as channel:
        stub = notifier_pb2_grpc.NotifierServiceStub(channel)
        response = stub.ReportFault(notifier_pb2.ReportFaultRequest(event=event), timeout=20)
    assert not response.suppressed
    return str(response.event_id)


def test_faults_list_and_follow(stack: Stack) -> None:
    event_id = report(stack, "buffer full for dsctl-e2e")

    def listed() -> list[dict[str, Any]] | None:
        faults = json_of(dsctl(stack, "faults", "--group", stack.group, "-o", "json"))["faults"]
        return faults if any(f["id"] == event_id for f in faults) else None

    faults = wait_for(listed, 30, "the reported fault listed")
    mine = next(f for f in faults if f["id"] == event_id)
    assert (mine["type"], mine["state"], mine["severity"]) == (
        "CLIENT_BACKPRESSURE", "OPEN", "WARNING"
    )  # fmt: skip
    assert mine["group"] == stack.group and mine["client_id"] == stack.client_id
    assert all(f["group"] == stack.group for f in faults)
    only_lost = dsctl(stack, "faults", "-g", stack.group, "-t", "CONSUMER_LOST", "-o", "json")
    assert event_id not in {f["id"] for f in json_of(only_lost)["faults"]}

    # --follow: new events arrive one JSON document per line.
    follow = subprocess.Popen(
        [sys.executable, "-m", "services.dsctl", "faults", "--group", stack.group, "--follow",
         "--limit", "0", "--count", "1", "-o", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=dsctl_env(stack),
    )  # fmt: skip
    assert follow.stdout is not None
    reported: list[str] = []
    stop = threading.Event()

    def keep_reporting() -> None:
        # The watch subscribes some time after the process starts: report until it shows.
        while not stop.is_set():
            reported.append(report(stack, "followed"))
            stop.wait(1.0)

    reporter = threading.Thread(target=keep_reporting, daemon=True)
    reporter.start()
    try:
        line = follow.stdout.readline()
        assert follow.wait(30) == 0
    finally:
        stop.set()
        reporter.join(10)
        follow.kill()
    event = json.loads(line)
    assert event["id"] in reported and event["message"] == "followed"


def test_unknown_group_exits_2(stack: Stack) -> None:
    for command in ("describe", "lag", "bindings"):
        result = dsctl(stack, command, "no-such-group", "-o", "json")
        assert result.returncode == 2, (command, result.stderr)
        assert "GROUP_NOT_FOUND" in result.stderr and "no-such-group" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_unreachable_services_exit_3(stack: Stack) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    for args in (
        ("groups", "--assigner", nowhere),
        ("lag", "-o", "json", "--assigner", nowhere),
        ("top", "--count", "1", "--assigner", nowhere),
        ("faults", "--notifier", nowhere),
    ):
        result = dsctl(stack, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert f"at {nowhere} is unreachable" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_usage_errors_exit_1(stack: Stack) -> None:
    result = dsctl(stack, "lag", "--no-such-option")
    assert result.returncode == 1 and "No such option" in result.stderr
    result = dsctl(stack, "faults", "--type", "NOT_A_TYPE")
    assert result.returncode == 1 and "unknown fault type" in result.stderr
