"""deploy/k8s rendered with the real kustomize and checked: valid for Kubernetes (strict
schemas), and saying what the README says: probes, resources, ports of ARCHITECTURE §9,
selectors that select, NetworkPolicies that open exactly the ports the pods serve, no RBAC,
a webhook that reaches the injector, rules and template equal to their sources."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.injector.template import SidecarTemplate
from tests.support.k8s import (
    K8S,
    OVERLAYS,
    REPO,
    consistency_problems,
    find,
    kustomize,
    name_of,
    render,
    validate,
)

pytestmark = pytest.mark.integration

PORTS = {"ds-assigner": {7070, 7071}, "ds-notifier": {7090, 7091}, "ds-injector": {8443}}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    binary = kustomize()
    return {name: render(name, binary) for name in OVERLAYS} | {
        "base": render(K8S / "base", binary)
    }


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def containers(deployment: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from deployment["spec"]["template"]["spec"]["containers"]


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are used here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_document_is_valid_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    assert {"Namespace", "Deployment", "Service", "ConfigMap", "NetworkPolicy"} <= {
        d["kind"] for d in docs
    }
    assert [p for p in map(validate, docs) if p] == []
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} <= {
        "dataservice",
        None,  # cluster-scoped: the MutatingWebhookConfiguration
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployments_are_probed_bounded_and_unprivileged(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    deployments = of_kind(rendered[overlay], "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == set(PORTS)
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in containers(deployment):
            where = f"{name_of(deployment)} {container['name']}"
            assert "readinessProbe" in container and "livenessProbe" in container, where
            # Liveness never asks a dependency (gRPC health and /healthz are NOT_SERVING
            # while Kafka is down), except the injector's /healthz, which has none.
            liveness = container["livenessProbe"]
            assert "grpc" not in liveness, where
            if deployment["metadata"]["name"] != "ds-injector":
                assert "grpc" in container["readinessProbe"], where
                assert "tcpSocket" in liveness, where
            assert container["resources"]["requests"].keys() >= {"cpu", "memory"}, where
            assert "memory" in container["resources"]["limits"], where
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            ports = {p["containerPort"] for p in container["ports"]}
            assert ports == PORTS[deployment["metadata"]["name"]], where


def test_assigner_replicas_election_and_disruption(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, replicas, consul in (("prod", 2, True), ("dev", 1, False)):
        docs = rendered[overlay]
        assigner = find(docs, "Deployment", "ds-assigner")
        assert assigner["spec"]["replicas"] == replicas
        env = {e["name"]: e for e in next(containers(assigner))["env"]}
        assert ("DS_CONSUL" in env) is consul, overlay
        assert env["DS_ADVERTISE_HOST"]["value"] == "$(POD_IP)"
        pdbs = of_kind(docs, "PodDisruptionBudget")
        if overlay == "dev":
            assert pdbs == []
            continue
        labels = assigner["spec"]["template"]["metadata"]["labels"]
        (pdb,) = [p for p in pdbs if matches(p["spec"]["selector"], labels)]
        assert pdb["spec"]["minAvailable"] == 1
        anti = assigner["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert matches(term["labelSelector"], labels)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_and_name_their_ports(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    for service in of_kind(docs, "Service"):
        (target,) = [
            d
            for d in of_kind(docs, "Deployment")
            if matches(
                {"matchLabels": service["spec"]["selector"]},
                d["spec"]["template"]["metadata"]["labels"],
            )
        ]
        named = {p["name"] for c in containers(target) for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named, name_of(service)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_open_exactly_the_served_ports(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    docs = rendered[overlay]
    policies = of_kind(docs, "NetworkPolicy")
    deny = find(docs, "NetworkPolicy", "default-deny")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    for deployment in of_kind(docs, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        opened = {
            port["port"]
            for policy in policies
            if policy["spec"]["podSelector"] and matches(policy["spec"]["podSelector"], labels)
            for rule in policy["spec"].get("ingress", [])
            for port in rule["ports"]
        }
        assert opened == PORTS[deployment["metadata"]["name"]], name_of(deployment)


def test_no_rbac_and_the_webhook_reaches_the_injector(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay in OVERLAYS:
        docs = rendered[overlay]
        assert not {d["kind"] for d in docs} & {
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
        }
        service = find(docs, "Service", "ds-injector")
        (webhook_config,) = of_kind(docs, "MutatingWebhookConfiguration")
        assert len(webhook_config["webhooks"]) == 2
        for webhook in webhook_config["webhooks"]:
            reference = webhook["clientConfig"]["service"]
            assert reference == {
                "name": service["metadata"]["name"],
                "namespace": service["metadata"]["namespace"],
                "path": "/inject",
                "port": service["spec"]["ports"][0]["port"],
            }
            assert webhook["rules"][0]["resources"] == ["pods"]
            assert webhook["rules"][0]["operations"] == ["CREATE"]
            expected = "Fail" if overlay == "prod" else "Ignore"
            assert webhook["failurePolicy"] == expected


def test_config_maps_equal_their_sources(rendered: dict[str, list[dict[str, Any]]]) -> None:
    base = rendered["base"]
    assert list(consistency_problems(base)) == []
    rules = find(base, "ConfigMap", "ds-prometheus-rules")
    assert rules["metadata"]["name"] == "ds-prometheus-rules"  # no hash: Prometheus names it
    for path in sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml")):
        assert rules["data"][path.name] == path.read_text()
    template = find(base, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
    assert SidecarTemplate(**yaml.safe_load(template)) == SidecarTemplate()
    env = find(base, "ConfigMap", "ds-env")["data"]
    assert env["DS_BOOTSTRAP"] == SidecarTemplate().bootstrap
    assert env["DS_NOTIFIER"] == SidecarTemplate().notifier


def test_a_drifted_rules_copy_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.support.k8s as k8s

    base = tmp_path / "deploy" / "k8s" / "base" / "prometheus-rules"
    base.mkdir(parents=True)
    sources = tmp_path / "deploy" / "prometheus" / "rules"
    sources.mkdir(parents=True)
    (sources / "alerts.yml").write_text("groups: []\n")
    (base / "alerts.yml").write_text("groups: [changed]\n")
    monkeypatch.setattr(k8s, "REPO", tmp_path)
    monkeypatch.setattr(k8s, "K8S", tmp_path / "deploy" / "k8s")
    assert "alerts.yml differs" in next(consistency_problems([]))


def test_settings_files_load_as_the_services_read_them() -> None:
    from services.assigner.settings import AssignerSettings
    from services.notifier.settings import NotifierSettings
    from services.runtime.settings import load_settings

    config = K8S / "base" / "config"
    assigner = load_settings(AssignerSettings, {}, config / "assigner.yaml")
    assert assigner.hold_window_seconds == 10 and assigner.groups == []
    assert assigner.hold_mode == "handoff"
    notifier = load_settings(NotifierSettings, {}, config / "notifier.yaml")
    assert str(notifier.resolved_outbox_path()) == "/var/lib/dataservice/notifier-outbox.sqlite"
