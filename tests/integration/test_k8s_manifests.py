"""deploy/k8s rendered with the real kustomize and checked: valid for Kubernetes (strict
schemas), and saying what the README says: probes, resources, ports of ARCHITECTURE §9,
selectors that select, NetworkPolicies that open exactly the ports the pods serve, RBAC for
the DsGroup operator alone (and its token the only one mounted), a webhook that reaches
the injector, rules and template equal to their sources."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.injector.patch import TOKEN_VOLUME, inject_pod
from services.injector.template import SidecarTemplate
from services.runtime.auth.policy import Permission, Policy, Verb
from services.runtime.auth.token_review import TokenReviewSettings
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

PORTS = {
    "ds-assigner": {7070, 7071},
    "ds-notifier": {7090, 7091},
    "ds-injector": {8443},
    "ds-operator": set(),  # serves nothing: it calls the API server and the assigner
}
OPERATOR_RULES = {
    ("ClusterRole", "ds-operator"): [
        {"apiGroups": ["dataservice.io"], "resources": ["dsgroups"],
         "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["dataservice.io"], "resources": ["dsgroups/status"],
         "verbs": ["get", "patch"]},
    ],
    ("Role", "ds-operator-lease"): [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "create", "update"]},
    ],
}  # fmt: skip
# Who gets a service-account token and a binding: the operator; in prod also the assigner,
# bound to system:auth-delegator for the TokenReviews of workload identity.
API_CALLERS = {"dev": {"ds-operator"}, "prod": {"ds-operator", "ds-assigner", "ds-notifier"}}
# prod: the services that review workload-identity tokens (TokenReview), each its own binding.
AUTH_DELEGATORS = [
    {
        "kind": "ClusterRoleBinding",
        "name": f"{service}-auth-delegator",
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:auth-delegator",
        },
        "subjects": [{"kind": "ServiceAccount", "name": service, "namespace": "dataservice"}],
    }
    for service in ("ds-assigner", "ds-notifier")
]


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
        operator = deployment["metadata"]["name"] == "ds-operator"
        # Only the API's callers get a token: the operator, and in prod the assigner and
        # the notifier (TokenReviews of workload identity).
        callers = API_CALLERS[overlay]
        assert pod["automountServiceAccountToken"] is (deployment["metadata"]["name"] in callers)
        for container in containers(deployment):
            where = f"{name_of(deployment)} {container['name']}"
            assert "readinessProbe" in container and "livenessProbe" in container, where
            if operator:  # no port: liveness is the age of the file each round touches
                assert "exec" in container["livenessProbe"], where
                assert "ports" not in container, where
                continue
            # Liveness never asks a dependency (gRPC health and /healthz are NOT_SERVING
            # while Kafka is down), except the injector's /healthz, which has none.
            liveness = container["livenessProbe"]
            assert "grpc" not in liveness, where
            if deployment["metadata"]["name"] != "ds-injector":
                # The gRPC port speaks TLS, which the kubelet's gRPC probe cannot: readiness
                # is /healthz over HTTPS (open without a token, the same answer).
                ready = container["readinessProbe"]["httpGet"]
                assert (ready["path"], ready["scheme"]) == ("/healthz", "HTTPS"), where
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


def test_rbac_is_the_operators_alone_and_the_webhook_reaches_the_injector(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay in OVERLAYS:
        docs = rendered[overlay]
        roles = {
            (d["kind"], d["metadata"]["name"]): d["rules"]
            for d in docs
            if d["kind"] in ("Role", "ClusterRole")
        }
        assert roles == OPERATOR_RULES
        bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
        delegator_names = {d["name"] for d in AUTH_DELEGATORS}
        for binding in bindings:
            if binding["metadata"]["name"] not in delegator_names:
                assert [s["name"] for s in binding["subjects"]] == ["ds-operator"]
        delegators = [
            {"kind": b["kind"], "name": b["metadata"]["name"], "roleRef": b["roleRef"],
             "subjects": b["subjects"]}
            for b in bindings
            if b["metadata"]["name"] in delegator_names
        ]  # fmt: skip
        assert delegators == (AUTH_DELEGATORS if overlay == "prod" else [])
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


# Secure by default where it ships (issue 37, finding 5): every overlay, dev included, runs
# the control plane with TLS (a client certificate verified when presented) and tokens
# checked against a policy; plaintext is something a developer turns on (`dsctl dev`), never
# a manifest default. Client certificates are not *required*: the kubelet's probes present
# none (gRPC's Python API makes mTLS all or nothing per server).
SECURE_ENV = {
    "DS_TLS__CA_FILE": "/var/run/dataservice/tls/ca.crt",
    "DS_TLS__CERT_FILE": "/var/run/dataservice/tls/tls.crt",
    "DS_TLS__KEY_FILE": "/var/run/dataservice/tls/tls.key",
    "DS_AUTH__ENABLED": "true",
    "DS_AUTH__IDENTITY_FROM": "token_or_certificate",
    "DS_AUTH__POLICY_FILE": "/var/run/dataservice/policy/policy.yaml",
    "DS_AUTH__JWT_KEY_FILE": "/var/run/dataservice/jwt/jwt.pub",
}


def env_of(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """A container's DS_* variables as the kubelet gives them (envFrom, then env)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        (config,) = [
            d
            for d in of_kind(docs, "ConfigMap")
            if d["metadata"]["name"] == name or d["metadata"]["name"].startswith(f"{name}-")
        ]
        env |= config["data"]
    env |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return env


def mounted(deployment: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume a container has mounted at the directory holding ``path``."""
    (mount,) = [
        m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mount.get("readOnly") is True, (name_of(deployment), mount)
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    return volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_control_plane_runs_mtls_and_tokens_by_default(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    from services.runtime.auth.policy import parse_policy

    docs = rendered[overlay]
    for name in ("ds-assigner", "ds-notifier"):
        deployment = find(docs, "Deployment", name)
        container = next(containers(deployment))
        env = env_of(docs, container)
        assert {k: env.get(k) for k in SECURE_ENV} == SECURE_ENV, (overlay, name)
        assert env["DS_HOST"] == "0.0.0.0"  # reached from other pods: over TLS only
        tls = mounted(deployment, container, SECURE_ENV["DS_TLS__CERT_FILE"])
        assert tls["secret"]["secretName"] == f"{name}-tls", name
        jwt = mounted(deployment, container, SECURE_ENV["DS_AUTH__JWT_KEY_FILE"])
        assert jwt["secret"]["secretName"] == "ds-jwt-public", name
        policy = mounted(deployment, container, SECURE_ENV["DS_AUTH__POLICY_FILE"])
        config = [
            d
            for d in of_kind(docs, "ConfigMap")
            if d["metadata"]["name"] == policy["configMap"]["name"]
        ]
        (policy_map,) = config
        parsed = parse_policy(policy_map["data"]["policy.yaml"])
        assert parsed.roles_of("ds-notifier"), "the shipped policy names the notifier"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grpc_ports_are_open_to_mesh_namespaces_only(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    """No ingress rule of ours admits every namespace (`namespaceSelector: {}`) or every
    address: the admin ports (7070 carries AdminService) take mesh namespaces only."""
    for policy in of_kind(rendered[overlay], "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            if "from" not in rule:
                assert [p["port"] for p in rule["ports"]] == [8443], name_of(policy)
                continue  # the API server is not a pod: the webhook port takes any source
            for peer in rule["from"]:
                assert peer.get("namespaceSelector") != {}, name_of(policy)
                assert peer.get("namespaceSelector", {}).get("matchLabels"), name_of(policy)


def test_injected_sidecars_listen_on_loopback_by_default() -> None:
    from services.injector.patch import sidecar_env

    env = {e["name"]: e.get("value") for e in sidecar_env("demo", SidecarTemplate())}
    assert env["DS_HOST"] == "127.0.0.1"
    injected = yaml.safe_load_all((K8S / "examples" / "app.injected.yaml").read_text())
    for doc in injected:
        for spec in [doc["spec"]["template"]["spec"]] if doc.get("kind") == "Deployment" else []:
            for container in spec.get("initContainers", []) + spec["containers"]:
                for entry in container.get("env", []):
                    if entry["name"] == "DS_HOST":
                        assert entry["value"] == "127.0.0.1", container["name"]


def test_prod_turns_workload_identity_on(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """prod: the injected pods get their projected tokens (the sidecar template), the
    assigner reviews them (DS_AUTH__TOKEN_REVIEW, its own token mounted, bound to
    system:auth-delegator, egress to the API server) and the policy names a service-account
    identity; dev and the base leave all of it off."""
    docs = rendered["prod"]
    template = find(docs, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
    loaded = SidecarTemplate(**yaml.safe_load(template))
    assert loaded == SidecarTemplate(
        workload_identity=True,
        ca_config_map="ds-ca",
        uds_dir="/var/run/dataservice/socket",
        memory_limit="320Mi",
    )
    assigner = find(docs, "Deployment", "ds-assigner")
    (container,) = containers(assigner)
    env = {e["name"]: e.get("value") for e in container["env"]}
    review = TokenReviewSettings.model_validate_json(env["DS_AUTH__TOKEN_REVIEW"])
    assert review.audiences == ()  # its own: ds-assigner
    assert find(docs, "ServiceAccount", "ds-assigner")["automountServiceAccountToken"] is True
    egress = find(docs, "NetworkPolicy", "ds-assigner")["spec"]["egress"]
    assert {
        "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]
    } in egress
    policy = yaml.safe_load(find(docs, "ConfigMap", "ds-auth-policy")["data"]["policy.yaml"])
    parsed = Policy.from_mapping(policy["identities"])
    assert any(name.startswith("system:serviceaccount:") for name in policy["identities"])
    # The example's injected sidecar (id: its pod's name) holds its own Session with its
    # pod-bound token, and only that one, in its group only.
    account, pod = "system:serviceaccount:shop:orders-consumer", "orders-consumer-7d9f8-x2x5q"
    assert parsed.allows(account, Permission(Verb.SESSION, pod), pod=pod)
    assert parsed.allows(account, Permission(Verb.SERVE, "orders"), pod=pod)
    assert not parsed.allows(account, Permission(Verb.SESSION, "orders-consumer-other"), pod=pod)
    assert not parsed.allows(account, Permission(Verb.SESSION, pod))  # a token bound to no pod
    for overlay in ("dev", "base"):
        others = rendered[overlay]
        template = find(others, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
        assert not SidecarTemplate(**yaml.safe_load(template)).workload_identity
        (container,) = containers(find(others, "Deployment", "ds-assigner"))
        assert "DS_AUTH__TOKEN_REVIEW" not in {e["name"] for e in container["env"]}


def test_prod_s_notifier_reviews_the_sidecars_ds_notifier_tokens(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """prod: an injected sidecar's fault reports carry its pod's ds-notifier token
    (DS_TLS__NOTIFIER_TOKEN_FILE, a third projected token), and the notifier reviews it as
    the assigner does (DS_AUTH__TOKEN_REVIEW with its own audience, its own token mounted,
    bound to system:auth-delegator, egress to the API server); the policy lets the example's
    service account report. dev and the base leave it off."""
    docs = rendered["prod"]
    template = find(docs, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"]
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}}
    spec = inject_pod(pod, "orders", SidecarTemplate(**yaml.safe_load(template)))["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME]
    assert {"audience": "ds-notifier", "expirationSeconds": 3600, "path": "notifier-token"} in [
        s.get("serviceAccountToken") for s in volume["projected"]["sources"]
    ]
    sidecar_env = {e["name"]: e.get("value") for e in spec["initContainers"][0]["env"]}
    assert sidecar_env["DS_TLS__NOTIFIER_TOKEN_FILE"] == "/var/run/dataservice/sa/notifier-token"
    notifier = find(docs, "Deployment", "ds-notifier")
    assert notifier["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    (container,) = containers(notifier)
    env = {e["name"]: e.get("value") for e in container["env"]}
    review = TokenReviewSettings.model_validate_json(env["DS_AUTH__TOKEN_REVIEW"])
    assert review.audiences == ()  # its own: ds-notifier
    assert find(docs, "ServiceAccount", "ds-notifier")["automountServiceAccountToken"] is True
    binding = find(docs, "ClusterRoleBinding", "ds-notifier-auth-delegator")
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ds-notifier", "namespace": "dataservice"}
    ]
    egress = find(docs, "NetworkPolicy", "ds-notifier")["spec"]["egress"]
    assert {"protocol": "TCP", "port": 6443} in [p for rule in egress for p in rule["ports"]]
    policy = yaml.safe_load(find(docs, "ConfigMap", "ds-auth-policy")["data"]["policy.yaml"])
    parsed = Policy.from_mapping(policy["identities"])
    assert parsed.allows("system:serviceaccount:shop:orders-consumer", Permission(Verb.REPORT))


def test_prod_s_sidecar_verifies_its_application_s_token(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """prod: the injected sidecar turns auth on (identity from the application's ds-sidecar
    token, verified against the API server's key set) on the pod's socket (uds_dir), its
    auth volume (API-audience token, kube-root-ca.crt, the namespace's ds-sidecar-policy)
    mounted in it only; the example policy lets orders-consumer read orders there."""
    docs = rendered["prod"]
    template = SidecarTemplate(
        **yaml.safe_load(find(docs, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"])
    )
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app"}]}}
    spec = inject_pod(pod, "orders", template)["spec"]
    sidecar, app = spec["initContainers"][0], spec["containers"][0]
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["DS_AUTH__ENABLED"] == "true" and env["DS_AUTH__IDENTITY_FROM"] == "token"
    assert env["DS_UDS_DIR"] == "/var/run/dataservice/socket"
    assert env["DS_HOST"] == "127.0.0.1" and "DS_TLS__CERT_FILE" not in env
    keys = json.loads(env["DS_AUTH__SERVICE_ACCOUNT_KEYS"])
    assert keys["server"] == "https://kubernetes.default.svc"
    [volume] = [v for v in spec["volumes"] if v["name"] == "ds-sidecar-auth"]
    names = [s.get("configMap", {}).get("name") for s in volume["projected"]["sources"]]
    assert names == [None, "kube-root-ca.crt", "ds-sidecar-policy"]
    assert "ds-sidecar-auth" in {m["name"] for m in sidecar["volumeMounts"]}
    assert "ds-sidecar-auth" not in {m["name"] for m in app["volumeMounts"]}
    example = yaml.safe_load((K8S / "examples" / "sidecar-policy.yaml").read_text())
    policy = Policy.from_mapping(yaml.safe_load(example["data"]["policy.yaml"])["identities"])
    account = "system:serviceaccount:shop:orders-consumer"
    assert policy.allows(account, Permission(Verb.READ, "orders"))
    assert not policy.allows(account, Permission(Verb.READ, "payments"))
    for overlay in ("dev", "base"):
        others = find(rendered[overlay], "ConfigMap", "ds-sidecar-template")["data"]
        plain = inject_pod(pod, "orders", SidecarTemplate(**yaml.safe_load(others["sidecar.yaml"])))
        sidecar_env = {e["name"] for e in plain["spec"]["initContainers"][0]["env"]}
        assert "DS_AUTH__ENABLED" not in sidecar_env
    for overlay in ("dev", "base"):
        (container,) = containers(find(rendered[overlay], "Deployment", "ds-notifier"))
        assert "DS_AUTH__TOKEN_REVIEW" not in {e["name"] for e in container["env"]}
