"""ds-operator (services/operator) against the real API server and a real assigner on the
real Kafka: two replicas, one leader by the coordination.k8s.io Lease; a DsGroup applied
with kubectl -> the group exists in the assigner (polled, bounded) and its status is filled
from the live mesh; an edit -> the live consumer config changes; a change made with dsctl
afterwards stays and shows as Drifted; the leader stopped -> the other replica takes the
Lease over; the resource deleted -> the group is deleted and the finalizer removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.devstack import kube, procs
from services.devstack.kafka import TopicFactory
from tests.k8s.conftest import REPO, get_json, wait_for
from tests.support.k8s import K8S
from tests.support.mesh import Mesh
from tests.support.ops import dsctl

# Bounded, not timed: a Kafka-backed assigner, two operators and a dozen dsctl runs took
# 300 s on this machine while other suites ran beside it (76 s alone).
pytestmark = [pytest.mark.timeout(600)]

NAMESPACE = "operated"


@pytest.fixture
def assigner(mesh: Mesh) -> str:
    tag = uuid.uuid4().hex[:8]
    env = {"DS_STATE_TOPIC": f"__ds_state_operator_{tag}", "DS_STATE_TRANSACTIONAL_ID": tag}
    running = mesh.assigner([], env=env)
    running.wait_serving()
    wait_for(lambda: dsctl(running.grpc_addr, "groups").returncode == 0, "assigner leads")
    return running.grpc_addr


@pytest.fixture
def operators(
    cluster: kube.Cluster, assigner: str, tmp_path: Path
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    cluster.kubectl("apply", "--server-side", "-f", str(K8S / "base" / "crds" / "dsgroup.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/dsgroups.dataservice.io")  # fmt: skip
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    running: dict[str, subprocess.Popen[bytes]] = {}
    for identity in ("operator-a", "operator-b"):
        running[identity] = procs.spawn(
            [
                sys.executable, "-m", "services.operator", "--assigner", assigner,
                "--kubeconfig", cluster.kubeconfig, "--namespace", NAMESPACE,
                "--lease-namespace", NAMESPACE, "--identity", identity,
                "--lease-duration", "6", "--interval", "1", "--log-format", "console",
            ],
            tmp_path / f"{identity}.log",
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'clients/python/src'}"},
        )  # fmt: skip
    try:
        yield running
    finally:
        for proc in running.values():
            procs.terminate(proc)
        for identity in running:
            print(f"--- {identity}.log\n{procs.log_tail(tmp_path / f'{identity}.log')}")


def holder(cluster: kube.Cluster) -> str | None:
    got = subprocess.run(
        cluster.argv("get", "lease", "ds-operator", "-n", NAMESPACE, "-o", "json"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if got.returncode != 0:
        return None
    return json.loads(got.stdout)["spec"].get("holderIdentity")


def resource(cluster: kube.Cluster, name: str) -> dict[str, Any]:
    return get_json(cluster, "dsgroup", name, "-n", NAMESPACE)  # type: ignore[no-any-return]


def condition(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (doc.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c  # type: ignore[no-any-return]
    return {}


def live_spec(assigner: str, group: str) -> dict[str, Any]:
    """The group's spec as the assigner has it; {} while it cannot say (no such group yet,
    or DescribeGroup UNAVAILABLE: Kafka's metadata of a topic just made), for wait_for."""
    got = dsctl(assigner, "get", "group", group, "-o", "yaml")
    return yaml.safe_load(got.stdout)["spec"] if got.returncode == 0 else {}


def gone(assigner: str, group: str) -> bool:
    return dsctl(assigner, "get", "group", group, "-o", "yaml").returncode == 2  # NOT_FOUND


def test_the_operator_reconciles_a_dsgroup_into_the_assigner(
    cluster: kube.Cluster,
    operators: dict[str, subprocess.Popen[bytes]],
    assigner: str,
    topic_factory: TopicFactory,
) -> None:
    topic = topic_factory(partitions=2)
    name = f"op-{uuid.uuid4().hex[:6]}"
    leader = wait_for(lambda: holder(cluster), "a Lease holder")
    assert leader in operators
    doc = {
        "apiVersion": "dataservice.io/v1alpha1",
        "kind": "DsGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"topics": [topic], "consumerConfig": {"fetch.max.bytes": "1048576"}},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))

    spec = wait_for(lambda: live_spec(assigner, name), "the group in the assigner")
    assert spec["topics"] == [topic] and spec["consumerConfig"] == {"fetch.max.bytes": "1048576"}
    ready = wait_for(
        lambda: (
            (r := resource(cluster, name)).get("status", {}).get("observedGeneration") == 1
            and condition(r, "Ready").get("status") == "True"
            and r
        ),
        "status written",
    )
    print(f"\n$ kubectl get dsg -n {NAMESPACE}\n" + cluster.kubectl("get", "dsg", "-n", NAMESPACE))
    print(json.dumps(ready["status"], indent=1))
    assert ready["status"]["groupName"] == name
    assert ready["status"]["partitions"] == 2 and ready["status"]["configVersion"] == 1
    assert ready["status"]["members"] == 0 and "lagRecords" in ready["status"]
    assert "dataservice.io/group" in ready["metadata"]["finalizers"]
    assert condition(ready, "Drifted")["status"] == "False"

    # An edit: the live consumer config changes (no restart), generation 2 observed.
    doc["spec"]["consumerConfig"] = {"fetch.max.bytes": "2097152"}  # type: ignore[index]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    wait_for(
        lambda: live_spec(assigner, name).get("consumerConfig") == {"fetch.max.bytes": "2097152"},
        "the edit applied",
    )
    wait_for(
        lambda: resource(cluster, name)["status"].get("observedGeneration") == 2, "generation 2"
    )

    # A change made with dsctl stays (the operator does not undo it) and shows as drift.
    changed = dsctl(assigner, "config", "set", name, "fetch.max.bytes=4194304", "--yes",
                    "--wait", "0")  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    drifted = wait_for(
        lambda: condition(r := resource(cluster, name), "Drifted").get("status") == "True" and r,
        "drift reported",
    )
    print(json.dumps(condition(drifted, "Drifted"), indent=1))
    assert "consumerConfig" in condition(drifted, "Drifted")["message"]
    wait_for(  # still the dsctl value: the operator did not undo it
        lambda: live_spec(assigner, name).get("consumerConfig") == {"fetch.max.bytes": "4194304"},
        "the dsctl change kept",
    )

    # The leader stops: the other replica takes the Lease over and goes on.
    procs.terminate(operators[leader])
    other = next(i for i in operators if i != leader)
    wait_for(lambda: holder(cluster) == other, "the other replica leads", timeout=60)

    # Deleted: the group goes from the assigner, then the resource (finalizer removed).
    cluster.kubectl("delete", "dsgroup", name, "-n", NAMESPACE, "--wait=false")
    wait_for(lambda: gone(assigner, name), "the group deleted")
    wait_for(
        lambda: name not in cluster.kubectl("get", "dsg", "-n", NAMESPACE, "-o", "name"),
        "the resource gone",
    )
