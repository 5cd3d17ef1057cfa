"""The sidecar patch (services/injector/patch.py): who is injected, what a pod gets, and the
guarantees dsctl inject and the webhook rely on (idempotence, opt-out, kinds untouched)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.settings import SidecarSettings
from services.dsctl.handoff import default_sidecar
from services.injector.patch import (
    APP_ENV_NAMES,
    GROUP,
    INJECT,
    SIDECAR_AUTH_VOLUME,
    SIDECAR_NAME,
    SOCKET_VOLUME,
    TOKEN_VOLUME,
    Action,
    decide,
    inject_document,
    inject_documents,
    inject_pod,
    sidecar_auth_volume,
)
from services.injector.template import SidecarTemplate
from tests.support.pods import groups, metadata, names, pod_templates

TEMPLATE = SidecarTemplate()
OTHER_TEMPLATE = SidecarTemplate(
    image="registry.example/dataservice-mesh:9.9.9",
    assigner="assigner.elsewhere:7070",
    grpc_port=9080,
    termination_grace_seconds=90,
    env={"DS_BUFFER_MAX_BYTES": "134217728"},
)


def deployment(pod: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "orders", **(meta or {})},
        "spec": {"selector": {"matchLabels": {"app": "orders"}}, "template": pod},
    }


def opted_in(group: str = "orders") -> dict[str, Any]:
    return {
        "metadata": {"annotations": {INJECT: "true", GROUP: group}},
        "spec": {"containers": [{"name": "app", "image": "orders:1"}]},
    }


# ---- the pod -------------------------------------------------------------------------


@given(pod_templates(), names, st.sampled_from([TEMPLATE, OTHER_TEMPLATE]))
@settings(max_examples=100)
def test_injecting_an_injected_pod_changes_nothing(
    pod: dict[str, Any], group: str, template: SidecarTemplate
) -> None:
    once = inject_pod(pod, group, template)
    assert inject_pod(once, group, template) == once


@given(pod_templates(), names)
@settings(max_examples=100)
def test_a_changed_template_converges_to_a_fresh_injection(pod: dict[str, Any], group: str) -> None:
    assert inject_pod(inject_pod(pod, group, TEMPLATE), group, OTHER_TEMPLATE) == inject_pod(
        pod, group, OTHER_TEMPLATE
    )


@given(pod_templates(), names)
@settings(max_examples=100)
def test_the_pod_gets_one_native_sidecar_first_and_keeps_the_rest(
    pod: dict[str, Any], group: str
) -> None:
    before = copy.deepcopy(pod)
    spec = inject_pod(pod, group, TEMPLATE)["spec"]
    assert pod == before, "the input was modified"
    init = spec["initContainers"]
    assert [c["name"] for c in init].count(SIDECAR_NAME) == 1
    assert init[0]["name"] == SIDECAR_NAME and init[0]["restartPolicy"] == "Always"
    others = [c for c in before["spec"].get("initContainers", []) if c["name"] != SIDECAR_NAME]
    assert init[1:] == others
    assert [c["name"] for c in spec["containers"]] == [
        c["name"] for c in before["spec"]["containers"]
    ]
    for injected, original in zip(spec["containers"], before["spec"]["containers"], strict=True):
        env = injected["env"]
        assert [e["name"] for e in env[:3]] == list(APP_ENV_NAMES)
        assert {e["name"]: e["value"] for e in env[:3]}["DS_GROUP"] == group
        theirs = [e for e in original.get("env", []) if e["name"] not in APP_ENV_NAMES]
        assert env[3:] == theirs
        assert {k: v for k, v in injected.items() if k != "env"} == {
            k: v for k, v in original.items() if k != "env"
        }
    grace = before["spec"].get("terminationGracePeriodSeconds", 30)
    assert spec["terminationGracePeriodSeconds"] == max(grace, TEMPLATE.termination_grace_seconds)
    assert pod["metadata"] == inject_pod(pod, group, TEMPLATE)["metadata"]


def test_the_sidecar_container() -> None:
    sidecar = inject_pod(opted_in(), "orders", OTHER_TEMPLATE)["spec"]["initContainers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}
    assert sidecar["image"] == "registry.example/dataservice-mesh:9.9.9"
    assert sidecar["args"] == ["sidecar"]
    assert env["DS_GROUP"] == "orders"
    assert env["DS_ID"] == "$(POD_NAME)"
    assert env["DS_ADVERTISE_HOST"] == "$(POD_IP)"
    assert env["DS_ASSIGNER"] == "assigner.elsewhere:7070"
    assert env["DS_GRPC_PORT"] == "9080"
    assert env["DS_BUFFER_MAX_BYTES"] == "134217728"
    assert "DS_CONSUL" not in env
    names_in_order = [e["name"] for e in sidecar["env"]]
    assert names_in_order.index("POD_IP") < names_in_order.index("DS_ADVERTISE_HOST")
    assert sidecar["readinessProbe"] == {
        "grpc": {"port": 9080},
        "periodSeconds": 5,
        "failureThreshold": 2,
    }
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == [
        "python", "-m", "services.dsctl.handoff", "--sidecar", "127.0.0.1:9080", "--timeout", "15",
    ]  # fmt: skip
    assert sidecar["resources"] == {
        "requests": {"cpu": "100m", "memory": "192Mi"},
        "limits": {"memory": "256Mi"},
    }


def test_consul_for_the_sidecar_may_name_the_node() -> None:
    template = SidecarTemplate(consul="$(HOST_IP):8500")
    sidecar = inject_pod(opted_in(), "orders", template)["spec"]["initContainers"][0]
    names_in_order = [e["name"] for e in sidecar["env"]]
    assert {"name": "DS_CONSUL", "value": "$(HOST_IP):8500"} in sidecar["env"]
    assert names_in_order.index("HOST_IP") < names_in_order.index("DS_CONSUL")


# ---- who is injected ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "workload", "default", "fallback", "expected"),
    [
        ({}, {}, False, "g", (False, None, False)),  # not opted in
        ({}, {}, True, "g", (True, "g", False)),  # namespace / --all
        ({"labels": {INJECT: "true", GROUP: "p"}}, {}, False, None, (True, "p", False)),
        ({"annotations": {INJECT: "false"}}, {}, True, "g", (False, None, False)),
        (
            {"annotations": {INJECT: "false"}},
            {"labels": {INJECT: "true"}},
            False,
            "g",
            (False, None, False),
        ),
        (
            {"labels": {INJECT: "true"}},
            {"annotations": {INJECT: "false"}},
            False,
            "g",
            (True, "g", False),
        ),
        ({}, {"annotations": {INJECT: "true", GROUP: "w"}}, False, None, (True, "w", False)),
        (
            {"annotations": {GROUP: "p"}},
            {"annotations": {INJECT: "true", GROUP: "w"}},
            False,
            "f",
            (True, "p", False),
        ),
        ({"annotations": {INJECT: "True"}}, {}, False, "f", (True, "f", False)),
        ({"annotations": {INJECT: "true"}}, {}, False, None, (False, None, True)),  # no group
        ({"annotations": {INJECT: "yes"}}, {}, False, "g", (False, None, True)),
        ({"annotations": {INJECT: "true", GROUP: "x" * 250}}, {}, False, None, (False, None, True)),
        (
            {"annotations": {INJECT: "true"}, "labels": {INJECT: "false"}},
            {},
            False,
            "g",
            (True, "g", False),
        ),
    ],
)
def test_decide(
    pod: dict[str, Any],
    workload: dict[str, Any],
    default: bool,
    fallback: str | None,
    expected: tuple[bool, str | None, bool],
) -> None:
    decision = decide(pod, workload, default=default, fallback_group=fallback)
    assert (decision.inject, decision.group, decision.error) == expected
    assert decision.reason


# ---- manifests ---------------------------------------------------------------------


@given(pod_templates(), metadata(), st.booleans(), groups)
@settings(max_examples=100)
def test_documents_inject_once_and_then_stay(
    pod: dict[str, Any], meta: dict[str, Any], default: bool, fallback: str | None
) -> None:
    doc = deployment(pod, meta)
    before = copy.deepcopy(doc)
    once, results = inject_document(doc, TEMPLATE, default=default, fallback_group=fallback)
    assert doc == before
    (result,) = results
    decision = decide(pod["metadata"], doc["metadata"], default=default, fallback_group=fallback)
    if not decision.inject:
        assert once == doc
        assert result.action is (Action.FAILED if decision.error else Action.SKIPPED)
        return
    assert result.action in (Action.INJECTED, Action.UPDATED, Action.UNCHANGED)
    assert once["spec"]["template"] == inject_pod(pod, str(decision.group), TEMPLATE)
    assert {k: v for k, v in once.items() if k != "spec"} == {
        k: v for k, v in doc.items() if k != "spec"
    }
    twice, again = inject_document(once, TEMPLATE, default=default, fallback_group=fallback)
    assert twice == once
    assert [r.action for r in again] == [Action.UNCHANGED]


@given(metadata())
def test_opted_out_workloads_stay_exactly_as_they_are(meta: dict[str, Any]) -> None:
    pod = opted_in()
    pod["metadata"]["annotations"][INJECT] = "false"
    doc = deployment(pod, meta)
    out, results = inject_document(doc, TEMPLATE, default=True, fallback_group="g")
    assert out == doc and out is doc
    assert [r.action for r in results] == [Action.SKIPPED]


OTHER_KINDS = [
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": []}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
    {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "d"},
        "spec": {"template": opted_in()},
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": {INJECT: "true", GROUP: "g"}},
        "spec": opted_in()["spec"],
    },
    {
        "apiVersion": "extensions/v1beta1",
        "kind": "Deployment",
        "metadata": {"name": "old"},
        "spec": {"template": opted_in()},
    },
    "a plain string",
    ["a", "list"],
]


@pytest.mark.parametrize("doc", OTHER_KINDS)
def test_other_kinds_pass_through_unchanged(doc: Any) -> None:
    before = copy.deepcopy(doc)
    out, results = inject_document(doc, TEMPLATE, default=True, fallback_group="g")
    assert out == before and results == []


@pytest.mark.parametrize(
    ("kind", "api_version"),
    [("Deployment", "apps/v1"), ("StatefulSet", "apps/v1"), ("Job", "batch/v1")],
)
def test_workload_kinds(kind: str, api_version: str) -> None:
    doc = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "w"},
        "spec": {"template": opted_in()},
    }
    out, results = inject_document(doc, TEMPLATE)
    assert [(r.kind, r.name, r.action) for r in results] == [(kind, f"{kind}/w", Action.INJECTED)]
    assert out["spec"]["template"]["spec"]["initContainers"][0]["name"] == SIDECAR_NAME


def test_a_list_is_injected_item_by_item_and_documents_keep_their_order() -> None:
    service = OTHER_KINDS[0]
    listed = {"apiVersion": "v1", "kind": "List", "items": [deployment(opted_in("a")), service]}
    docs, results = inject_documents([service, listed, deployment(opted_in("b"))], TEMPLATE)
    assert docs[0] == service and docs[1]["items"][1] == service
    assert [r.reason for r in results] == ["group a", "group b"]
    assert (
        docs[1]["items"][0]["spec"]["template"]["spec"]["initContainers"][0]["name"] == SIDECAR_NAME
    )


@given(pod_templates())
@settings(max_examples=50)
def test_a_socket_dir_gives_the_pod_a_shared_in_memory_volume(pod: dict[str, Any]) -> None:
    """With ``uds_dir`` the sidecar and every application container mount one emptyDir
    (medium Memory) there and both are told the path; injecting again changes nothing, and
    a template without it takes the volume away again."""
    template = TEMPLATE.model_copy(update={"uds_dir": "/var/run/dataservice"})
    injected = inject_pod(pod, "orders", template)
    spec = injected["spec"]
    ours = [v for v in spec["volumes"] if v["name"] == SOCKET_VOLUME]
    # 1 MiB for the socket, and two streams' shared-memory segments of 32 MiB (defaults).
    assert ours == [{"name": SOCKET_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "65Mi"}}]
    mount = {"name": SOCKET_VOLUME, "mountPath": "/var/run/dataservice"}
    sidecar = spec["initContainers"][0]
    assert mount in sidecar["volumeMounts"]
    assert {"name": "DS_UDS_DIR", "value": "/var/run/dataservice"} in sidecar["env"]
    assert {"name": "DS_SHM_SEGMENT_BYTES", "value": str(32 * 1024 * 1024)} in sidecar["env"]
    for container in spec["containers"]:
        assert mount in container["volumeMounts"]
        assert {"name": "DS_UDS_DIR", "value": "/var/run/dataservice"} in container["env"]
    assert inject_pod(injected, "orders", template) == injected
    assert inject_pod(injected, "orders", TEMPLATE) == inject_pod(pod, "orders", TEMPLATE)


def test_the_shared_volume_is_sized_for_the_shared_memory_streams() -> None:
    template = TEMPLATE.model_copy(
        update={"uds_dir": "/var/run/ds", "shm_segment_mib": 16, "shm_streams": 4}
    )
    spec = inject_pod({"spec": {"containers": [{"name": "app"}]}}, "orders", template)["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == SOCKET_VOLUME]
    assert volume["emptyDir"]["sizeLimit"] == "65Mi"
    sidecar_env = spec["initContainers"][0]["env"]
    assert {"name": "DS_SHM_SEGMENT_BYTES", "value": str(16 * 1024 * 1024)} in sidecar_env
    # Without a socket there is no segment: the setting is not passed.
    plain = inject_pod({"spec": {"containers": [{"name": "app"}]}}, "orders", TEMPLATE)["spec"]
    assert not [e for e in plain["initContainers"][0]["env"] if e["name"] == "DS_SHM_SEGMENT_BYTES"]


IDENTITY = SidecarTemplate(
    workload_identity=True, ca_config_map="ds-ca", uds_dir="/var/run/dataservice/socket"
)


@given(pod_templates())
@settings(max_examples=50, deadline=None)  # a loaded machine: no per-example time limit
def test_workload_identity_projects_the_service_account_tokens(pod: dict[str, Any]) -> None:
    """With ``workload_identity`` the pod gets one projected volume: its service account's
    tokens for the assigner (audience ds-assigner) and for its sidecar (ds-sidecar), an hour
    each, and the CA; the sidecar and every application container mount it read-only and
    are told the files. Injecting again changes nothing; a template without it takes it
    all away again."""
    injected = inject_pod(pod, "orders", IDENTITY)
    spec = injected["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME]
    assert volume == {
        "name": TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": "ds-assigner",
                        "expirationSeconds": 3600,
                        "path": "token",
                    }
                },
                {
                    "serviceAccountToken": {
                        "audience": "ds-sidecar",
                        "expirationSeconds": 3600,
                        "path": "sidecar-token",
                    }
                },
                {
                    "serviceAccountToken": {
                        "audience": "ds-notifier",
                        "expirationSeconds": 3600,
                        "path": "notifier-token",
                    }
                },
                {"configMap": {"name": "ds-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ],
        },
    }
    mount = {"name": TOKEN_VOLUME, "mountPath": "/var/run/dataservice/sa", "readOnly": True}
    sidecar = spec["initContainers"][0]
    assert mount in sidecar["volumeMounts"]
    sidecar_env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert sidecar_env["DS_TLS__TOKEN_FILE"] == "/var/run/dataservice/sa/token"
    assert sidecar_env["DS_TLS__CA_FILE"] == "/var/run/dataservice/sa/ca.crt"
    # Its preStop hand-off asks the sidecar itself (Status) as its application does.
    assert sidecar_env["DS_TLS__SIDECAR_TOKEN_FILE"] == "/var/run/dataservice/sa/sidecar-token"
    # Its fault reports carry the ds-notifier token: the notifier refuses a ds-assigner one.
    assert sidecar_env["DS_TLS__NOTIFIER_TOKEN_FILE"] == "/var/run/dataservice/sa/notifier-token"
    for container in spec["containers"]:
        assert mount in container["volumeMounts"]
        env = [(e["name"], e.get("value")) for e in container["env"]]
        assert ("DS_TLS__TOKEN_FILE", "/var/run/dataservice/sa/token") in env
        assert ("DS_TLS__SIDECAR_TOKEN_FILE", "/var/run/dataservice/sa/sidecar-token") in env
        assert ("DS_TLS__CA_FILE", "/var/run/dataservice/sa/ca.crt") in env
        assert "DS_TLS__NOTIFIER_TOKEN_FILE" not in dict(env)  # it reports no faults
        assert [name for name, _ in env].count("DS_TLS__TOKEN_FILE") == 1
    # The sidecar verifies its application's token: its own auth volume, in it only.
    auth_mount = {
        "name": SIDECAR_AUTH_VOLUME,
        "mountPath": "/var/run/dataservice/sidecar-auth",
        "readOnly": True,
    }
    assert auth_mount in sidecar["volumeMounts"]
    assert all(auth_mount not in c.get("volumeMounts", []) for c in spec["containers"])
    assert [v for v in spec["volumes"] if v["name"] == SIDECAR_AUTH_VOLUME] == [
        sidecar_auth_volume(IDENTITY)
    ]
    assert sidecar_env["DS_AUTH__ENABLED"] == "true"
    assert inject_pod(injected, "orders", IDENTITY) == injected
    assert inject_pod(injected, "orders", TEMPLATE) == inject_pod(pod, "orders", TEMPLATE)


def test_the_sidecar_verifies_its_application_s_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """With workload identity the sidecar's env turns auth on (identity from the token,
    checked against the API server's key set fetched with the auth volume's API token and
    CA, the namespace's policy ConfigMap), and the volume holds exactly those files; the
    sidecar's own settings accept that env: auth without TLS, on the pod's socket only."""
    volume = sidecar_auth_volume(IDENTITY)
    assert volume == {
        "name": "ds-sidecar-auth",
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                # No audience: the API server's own (what /openid/v1/jwks is fetched with).
                {"serviceAccountToken": {"expirationSeconds": 3600, "path": "api-token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "api-ca.crt"}],
                    }
                },
                {
                    "configMap": {
                        "name": "ds-sidecar-policy",
                        "items": [{"key": "policy.yaml", "path": "policy.yaml"}],
                    }
                },
            ],
        },
    }
    spec = inject_pod({"spec": {"containers": [{"name": "app"}]}}, "orders", IDENTITY)["spec"]
    env = {e["name"]: e.get("value") for e in spec["initContainers"][0]["env"]}
    assert {k: v for k, v in env.items() if k.startswith("DS_AUTH__")} == {
        "DS_AUTH__ENABLED": "true",
        "DS_AUTH__IDENTITY_FROM": "token",
        "DS_AUTH__POLICY_FILE": "/var/run/dataservice/sidecar-auth/policy.yaml",
        "DS_AUTH__SERVICE_ACCOUNT_KEYS": '{"server":"https://kubernetes.default.svc",'
        '"ca_file":"/var/run/dataservice/sidecar-auth/api-ca.crt",'
        '"token_file":"/var/run/dataservice/sidecar-auth/api-token",'
        '"issuer":"https://kubernetes.default.svc"}',
    }
    assert "DS_TLS__CERT_FILE" not in env
    given_env = {k: v for k, v in env.items() if v is not None and k.startswith("DS_")}
    given_env["DS_ID"] = "orders-consumer-7d9f-abcde"  # the kubelet's $(POD_NAME)
    given_env["DS_ADVERTISE_HOST"] = "10.0.0.7"
    for name, value in given_env.items():
        monkeypatch.setenv(name, value)
    loaded = SidecarSettings()  # type: ignore[call-arg]
    assert loaded.auth.enabled and loaded.tokens_only_on_socket()
    assert loaded.auth.service_account_keys is not None
    assert str(loaded.auth.service_account_keys.token_file).endswith("/api-token")
    # The preStop hand-off finds the socket from the sidecar's env (no --sidecar), where a
    # sidecar taking tokens on its socket only answers it.
    command = spec["initContainers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python", "-m", "services.dsctl.handoff", "--timeout", "15"]
    assert default_sidecar(given_env) == (
        "unix:/var/run/dataservice/socket/sidecar-orders-consumer-7d9f-abcde.d/"
        "sidecar-orders-consumer-7d9f-abcde.sock"
    )
    assert default_sidecar({"DS_GRPC_PORT": "9080"}) == "127.0.0.1:9080"
    # Without workload identity: nothing of it.
    plain = inject_pod({"spec": {"containers": [{"name": "app"}]}}, "orders", TEMPLATE)["spec"]
    assert not [e for e in plain["initContainers"][0]["env"] if e["name"].startswith("DS_AUTH")]


def test_without_workload_identity_the_pod_gets_no_token() -> None:
    spec = inject_pod({"spec": {"containers": [{"name": "app"}]}}, "orders", TEMPLATE)["spec"]
    assert "volumes" not in spec
    names = {e["name"] for c in [*spec["initContainers"], *spec["containers"]] for e in c["env"]}
    assert not names & {
        "DS_TLS__TOKEN_FILE",
        "DS_TLS__SIDECAR_TOKEN_FILE",
        "DS_TLS__NOTIFIER_TOKEN_FILE",
        "DS_TLS__CA_FILE",
    }


def test_the_applications_own_token_is_replaced_only_by_workload_identity() -> None:
    """An application that names its own token file keeps it without workload identity;
    with it, injection owns DS_TLS__TOKEN_FILE (one entry, ours); without ca_config_map the
    CA is the application's own."""
    own = [
        {"name": "DS_TLS__TOKEN_FILE", "value": "/secrets/app.jwt"},
        {"name": "DS_TLS__CA_FILE", "value": "/secrets/ca.crt"},
    ]
    pod = {"spec": {"containers": [{"name": "app", "env": own}]}}
    plain = inject_pod(pod, "orders", TEMPLATE)["spec"]["containers"][0]["env"]
    assert own[0] in plain and own[1] in plain
    template = TEMPLATE.model_copy(
        update={"workload_identity": True, "token_expiration_seconds": 600}
    )
    spec = inject_pod(pod, "orders", template)["spec"]
    env = spec["containers"][0]["env"]
    assert [e for e in env if e["name"] == "DS_TLS__TOKEN_FILE"] == [
        {"name": "DS_TLS__TOKEN_FILE", "value": "/var/run/dataservice/sa/token"}
    ]
    assert own[1] in env
    [volume] = [v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME]
    assert [
        s["serviceAccountToken"]["expirationSeconds"] for s in volume["projected"]["sources"]
    ] == [600, 600, 600]
