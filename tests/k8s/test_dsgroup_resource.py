"""The DsGroup CustomResourceDefinition (deploy/k8s/base/crds/dsgroup.yaml) on a real API
server: established, a DsGroup stored with the schema's defaults and shown with the printer
columns, invalid ones refused by the server's validation (not by a client), the group name
immutable, and status a subresource (a spec write cannot change it, nor a status write the
spec)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from services.devstack import kube
from tests.k8s.conftest import get_json, wait_for
from tests.support.k8s import K8S, find, render

pytestmark = [pytest.mark.timeout(300)]

NAMESPACE = "groups"


def dsgroup(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dataservice.io/v1alpha1",
        "kind": "DsGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"topics": ["orders"], **spec},
    }


def apply(cluster: kube.Cluster, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.argv("apply", "--server-side", "-f", "-"),
        input=json.dumps(doc), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def crd(cluster: kube.Cluster) -> dict[str, Any]:
    definition = find(render("dev"), "CustomResourceDefinition", "dsgroups.dataservice.io")
    cluster.kubectl("apply", "--server-side", "-f", str(K8S / "base" / "crds" / "dsgroup.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/dsgroups.dataservice.io")  # fmt: skip
    cluster.kubectl("create", "namespace", NAMESPACE)
    # Discovery of a new resource reaches kubectl's cache a moment after Established.
    wait_for(
        lambda: apply(cluster, dsgroup("probe")).returncode == 0, "dsgroups served", timeout=60
    )
    cluster.kubectl("delete", "dsgroup", "probe", "-n", NAMESPACE)
    return definition


def test_a_dsgroup_is_stored_with_defaults_and_listed_with_the_printer_columns(
    cluster: kube.Cluster, crd: dict[str, Any]
) -> None:
    created = apply(cluster, dsgroup("orders", consumerConfig={"fetch.max.bytes": "1048576"}))
    assert created.returncode == 0, created.stderr
    stored = get_json(cluster, "dsgroup", "orders", "-n", NAMESPACE)
    assert stored["spec"]["mode"] == "leased"  # the schema's default, applied by the server
    assert stored["metadata"]["generation"] == 1

    table = cluster.kubectl("get", "dsg", "-n", NAMESPACE)
    print(f"\n$ kubectl get dsg -n {NAMESPACE}\n{table}")
    header = table.splitlines()[0].split()
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert header == ["NAME", *(c["name"].upper() for c in columns)]


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        ({"topics": []}, "spec.topics"),
        ({"mode": "round_robin"}, "spec.mode"),
        ({"visibilityTimeout": "thirty seconds"}, "spec.visibilityTimeout"),
        ({"maxDeliveries": -2}, "spec.maxDeliveries"),
        ({"balanceStrategy": "random"}, "spec.balanceStrategy"),
    ],
)
def test_an_invalid_dsgroup_is_refused_by_the_server(
    cluster: kube.Cluster, crd: dict[str, Any], spec: dict[str, Any], refusal: str
) -> None:
    result = apply(cluster, dsgroup("invalid", **spec))
    assert result.returncode != 0
    assert "Invalid value" in result.stderr or "Unsupported value" in result.stderr
    assert refusal in result.stderr, result.stderr


def test_the_group_name_is_immutable(cluster: kube.Cluster, crd: dict[str, Any]) -> None:
    assert apply(cluster, dsgroup("payments", groupName="payments.v1")).returncode == 0
    changed = apply(cluster, dsgroup("payments", groupName="payments.v2"))
    assert changed.returncode != 0
    assert "groupName is immutable" in changed.stderr, changed.stderr


def test_status_is_a_subresource(cluster: kube.Cluster, crd: dict[str, Any]) -> None:
    assert apply(cluster, dsgroup("refunds")).returncode == 0
    status = {"status": {"groupName": "refunds", "members": 2, "partitionsHeld": 6,
                         "observedGeneration": 1}}  # fmt: skip
    cluster.kubectl("patch", "dsgroup", "refunds", "-n", NAMESPACE, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))  # fmt: skip
    # A status written through the main resource is dropped; a spec change is kept.
    both = {"spec": {"topics": ["refunds"]}, "status": {"members": 9}}
    cluster.kubectl(
        "patch", "dsgroup", "refunds", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(both)
    )
    stored = get_json(cluster, "dsgroup", "refunds", "-n", NAMESPACE)
    assert stored["status"]["members"] == 2
    assert stored["spec"]["topics"] == ["refunds"]
    assert stored["metadata"]["generation"] == 2  # a status write never bumps it
    print("\n" + cluster.kubectl("get", "dsg", "refunds", "-n", NAMESPACE))
