"""Workload identity wired by injection, against the real API server: the prod overlay's
sidecar template (workload_identity on) served by a local injector that the API server
calls through the manifests' MutatingWebhookConfiguration. A Pod created in an opted-in
namespace is *stored* with one projected volume of its service account's tokens (audience
ds-assigner and ds-sidecar, an hour) and the CA of ConfigMap ds-ca, mounted read-only in
the sidecar and the application, named by DS_TLS__TOKEN_FILE / DS_TLS__SIDECAR_TOKEN_FILE /
DS_TLS__CA_FILE; no Secret holds a token for them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.devstack import kube
from services.injector.patch import SIDECAR_NAME, TOKEN_DIR, TOKEN_VOLUME
from tests.k8s.conftest import Injector, get_json, wait_for

pytestmark = [pytest.mark.timeout(300)]

NAMESPACE = "wid-shop"  # labelled dataservice.io/inject=true
ACCOUNT = "orders-consumer"


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-consumer-",
            "namespace": NAMESPACE,
            "annotations": {"dataservice.io/group": "orders"},
        },
        "spec": {
            "serviceAccountName": ACCOUNT,
            "containers": [{"name": "app", "image": "registry.example/shop/orders:2.3.1"}],
        },
    }


def create(cluster: kube.Cluster, *, dry_run: bool = False) -> dict[str, Any]:
    args = cluster.argv("create", "-f", "-", "-o", "json")
    if dry_run:
        args.append("--dry-run=server")
    done = subprocess.run(args, input=json.dumps(pod()), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    created: dict[str, Any] = json.loads(done.stdout)
    return created


def injected(created: dict[str, Any]) -> bool:
    return any(c["name"] == SIDECAR_NAME for c in created["spec"].get("initContainers") or [])


@pytest.fixture(scope="module")
def opted_in(cluster: kube.Cluster) -> None:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"dataservice.io/inject": "true"}},
    }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(namespace))
    cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", NAMESPACE)
    # What trust-manager (or the platform) puts in every mesh namespace: the assigner's CA.
    ca = Path(__file__).with_name("conftest.py")  # any text: the API server stores it as is
    cluster.kubectl("create", "configmap", "ds-ca", "-n", NAMESPACE, f"--from-file=ca.crt={ca}")
    wait_for(
        lambda: ACCOUNT in cluster.kubectl("get", "sa", ACCOUNT, "-n", NAMESPACE, check=False),
        f"service account {NAMESPACE}/{ACCOUNT}",
    )


def test_an_injected_pod_is_stored_with_its_projected_tokens(
    cluster: kube.Cluster, prod_injector: Injector, opted_in: None
) -> None:
    wait_for(lambda: injected(create(cluster, dry_run=True)), "the webhook configuration in effect")
    name = create(cluster)["metadata"]["name"]
    stored = get_json(cluster, "pod", name, "-n", NAMESPACE)  # read back, as stored
    spec = stored["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME]
    sources = volume["projected"]["sources"]
    tokens = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert tokens == [
        {"audience": "ds-assigner", "expirationSeconds": 3600, "path": "token"},
        {"audience": "ds-sidecar", "expirationSeconds": 3600, "path": "sidecar-token"},
        {"audience": "ds-notifier", "expirationSeconds": 3600, "path": "notifier-token"},
    ]
    assert {"configMap": {"name": "ds-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in (
        sources
    )
    # No Secret volume carries a token for them (Kubernetes' own kube-api-access is
    # projected too).
    assert not [v for v in spec["volumes"] if "secret" in v]
    sidecar = next(c for c in spec["initContainers"] if c["name"] == SIDECAR_NAME)
    app = next(c for c in spec["containers"] if c["name"] == "app")
    mount = {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}
    rows = [f"stored pod {NAMESPACE}/{name} (serviceAccountName {spec['serviceAccountName']}):",
            f"  volume {TOKEN_VOLUME}: " + json.dumps(volume["projected"])]  # fmt: skip
    for container, expected in (
        (
            sidecar,
            {
                "DS_TLS__TOKEN_FILE": f"{TOKEN_DIR}/token",
                "DS_TLS__NOTIFIER_TOKEN_FILE": f"{TOKEN_DIR}/notifier-token",
                # Its preStop hand-off asks the sidecar itself (Status).
                "DS_TLS__SIDECAR_TOKEN_FILE": f"{TOKEN_DIR}/sidecar-token",
            },
        ),
        (
            app,
            {
                "DS_TLS__TOKEN_FILE": f"{TOKEN_DIR}/token",
                "DS_TLS__SIDECAR_TOKEN_FILE": f"{TOKEN_DIR}/sidecar-token",
            },
        ),
    ):
        assert mount in container["volumeMounts"], container["name"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env.items() >= {**expected, "DS_TLS__CA_FILE": f"{TOKEN_DIR}/ca.crt"}.items()
        ours = {k: v for k, v in env.items() if k.startswith("DS_TLS__")}
        rows.append(f"  {container['name']}: mount {mount} env {ours}")
    assert "DS_TLS__NOTIFIER_TOKEN_FILE" not in {e["name"] for e in app["env"]}
    print("\n" + "\n".join(rows))
