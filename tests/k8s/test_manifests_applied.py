"""Both overlays applied to a real API server with ``kubectl apply -k --server-side``: the
server accepts every object (its validation, defaulting and admission, not a schema file),
a second apply changes nothing (``kubectl diff`` is empty), the controllers turn the
Deployments into ReplicaSets and Pods, and every service account of the manifests is allowed
exactly what the manifests' RBAC grants it (``kubectl auth can-i``)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from services.devstack import kube
from tests.k8s.conftest import get_json, wait_for
from tests.support.k8s import K8S, OVERLAYS, render

pytestmark = [pytest.mark.timeout(600)]

NAMESPACE = "dataservice"
# What a workload identity must not be able to do unless a Role says so.
SENSITIVE = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("create", "pods"),
    ("delete", "pods"),
    ("get", "configmaps"),
    ("update", "deployments.apps"),
    ("create", "leases.coordination.k8s.io"),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "dsgroups.dataservice.io"),
    # system:auth-delegator's (prod binds the assigner and the notifier to it: workload identity).
    ("create", "tokenreviews.authentication.k8s.io"),
]


def applied_kinds(output: str) -> list[str]:
    """``kind/name serverside-applied`` lines of ``kubectl apply --server-side``."""
    return [line.split()[0] for line in output.splitlines() if "serverside-applied" in line]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_applies_server_side_and_reapplies_clean(
    cluster: kube.Cluster, overlay: str
) -> None:
    path = K8S / "overlays" / overlay
    out = cluster.kubectl("apply", "-k", str(path), "--server-side", "--force-conflicts")
    print(f"\n$ kubectl apply -k deploy/k8s/overlays/{overlay} --server-side\n{out}")
    rendered = render(overlay)
    assert len(applied_kinds(out)) == len(rendered), out

    # A second apply is a no-op: the server's dry run of it differs from nothing stored.
    diff = subprocess.run(
        cluster.argv("diff", "-k", str(path), "--server-side", "--force-conflicts"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert diff.returncode == 0, f"second apply would change:\n{diff.stdout}{diff.stderr}"
    again = cluster.kubectl("apply", "-k", str(path), "--server-side", "--dry-run=server")
    assert len(applied_kinds(again)) == len(rendered), again

    # Every object is stored as rendered (the server kept what the overlay says).
    for doc in rendered:
        kind, name = doc["kind"], doc["metadata"]["name"]
        namespace = doc["metadata"].get("namespace")
        scope = ["-n", namespace] if namespace else []
        stored = get_json(cluster, kind, name, *scope)
        assert stored["metadata"]["name"] == name
        if kind == "MutatingWebhookConfiguration":
            policies = [w["failurePolicy"] for w in stored["webhooks"]]
            assert policies == [w["failurePolicy"] for w in doc["webhooks"]]
            print(f"{kind}/{name}: failurePolicy {policies}")
        if kind == "Deployment":
            assert stored["spec"]["replicas"] == doc["spec"].get("replicas", 1)


def test_deployments_get_replicasets_and_pods(cluster: kube.Cluster) -> None:
    """The controller manager runs: each Deployment's pods are created (and stay Pending:
    no scheduler, no kubelet here). The namespace's restricted Pod Security admits them."""
    cluster.kubectl("apply", "-k", str(K8S / "overlays" / "dev"), "--server-side")
    deployments = [d for d in render("dev") if d["kind"] == "Deployment"]
    assert deployments
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        selector = ",".join(
            f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
        )

        def pods(selector: str = selector) -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = get_json(
                cluster, "pods", "-n", NAMESPACE, "-l", selector
            )["items"]
            return items

        want = deployment["spec"].get("replicas", 1)
        found = wait_for(lambda pods=pods, want=want: len(pods()) >= want and pods(), name)
        print(f"Deployment/{name}: {len(found)} pods, phase {found[0]['status']['phase']}")
        assert {p["metadata"]["ownerReferences"][0]["kind"] for p in found} == {"ReplicaSet"}


def service_accounts(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")


def granted(
    cluster: kube.Cluster, docs: list[dict[str, Any]], account: str
) -> set[tuple[str, str]]:
    """(verb, resource) pairs the manifests' Roles and ClusterRoles grant ``account``; a
    ClusterRole they bind but do not define (Kubernetes' own, system:auth-delegator) as
    the server has it."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = (binding["roleRef"]["kind"], binding["roleRef"]["name"])
        if ref not in roles and ref[0] == "ClusterRole":
            roles[ref] = get_json(cluster, "clusterrole", ref[1])
    pairs: set[tuple[str, str]] = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = binding.get("subjects") or []
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in subjects):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", [""]):
                for resource in rule.get("resources", []):
                    full = resource if group == "" else f"{resource}.{group}"
                    pairs.update((verb, full) for verb in rule.get("verbs", []))
    return pairs


def can_i(cluster: kube.Cluster, verb: str, resource: str, account: str) -> bool:
    result = subprocess.run(
        cluster.argv("auth", "can-i", verb, resource, "-n", NAMESPACE,
                     f"--as=system:serviceaccount:{NAMESPACE}:{account}"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_account_can_do_what_its_roles_grant_and_nothing_else(
    cluster: kube.Cluster, overlay: str
) -> None:
    docs = render(overlay)
    # Bindings another overlay applied and this one has not (prod's auth-delegator binding
    # of the assigner) are not pruned by an apply: removed, so the cluster is this overlay's.
    ours = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for other in (o for o in OVERLAYS if o != overlay):
        for doc in render(other):
            key = (doc["kind"], doc["metadata"]["name"])
            if key[0] in ("RoleBinding", "ClusterRoleBinding") and key not in ours:
                scope = ["-n", doc["metadata"]["namespace"]] if key[0] == "RoleBinding" else []
                cluster.kubectl("delete", key[0], key[1], *scope, "--ignore-not-found")
    cluster.kubectl("apply", "-k", str(K8S / "overlays" / overlay), "--server-side",
                    "--force-conflicts")  # fmt: skip
    accounts = service_accounts(docs)
    assert accounts
    rows = []
    for account in accounts:
        allowed = granted(cluster, docs, account)
        for verb, resource in sorted(allowed | set(SENSITIVE)):
            answer = can_i(cluster, verb, resource, account)
            rows.append(f"{account:<12} {verb:<7} {resource:<60} {'yes' if answer else 'no'}")
            assert answer == ((verb, resource) in allowed), rows[-1]
    print(f"\nkubectl auth can-i ({overlay}):\n" + "\n".join(rows))
