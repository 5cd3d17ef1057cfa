"""The injector registered with the API server by the manifests' own
MutatingWebhookConfiguration (its selectors, rules and failurePolicy as rendered; only
``clientConfig`` points at the local process, with the test CA as ``caBundle``): a Pod created
in an opted-in namespace is *stored* with the sidecar, one elsewhere without; with the
injector down, each overlay's failurePolicy decides whether pods are created; the serving
certificate is rotated under a stream of pod creations with none failing."""

from __future__ import annotations

import base64
import copy
import json
import socket
import ssl
import subprocess
import threading
from typing import Any

import pytest
import yaml
from cryptography import x509

from services.devstack import kube
from services.injector.patch import SIDECAR_NAME
from tests.k8s.conftest import Injector, WebhookCa, get_json, wait_for
from tests.support.k8s import EXAMPLES, find, render

pytestmark = [pytest.mark.timeout(600)]

OPTED_IN = "shop"  # labelled dataservice.io/inject=true
OTHER = "plain"  # no label


def app_pod(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The example application's pod (deploy/k8s/examples/app.yaml's template), as a
    ReplicaSet would create it."""
    deployment = next(yaml.safe_load_all((EXAMPLES / "app.yaml").read_text()))
    template = copy.deepcopy(deployment["spec"]["template"])
    metadata = template["metadata"]
    metadata["labels"] = {**metadata.get("labels", {}), **(labels or {})}
    metadata.update(generateName="orders-consumer-", namespace=namespace)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def injected(pod: dict[str, Any]) -> bool:
    return any(c["name"] == SIDECAR_NAME for c in pod["spec"].get("initContainers") or [])


def create_pod(
    cluster: kube.Cluster, pod: dict[str, Any], *, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    args = cluster.argv("create", "-f", "-", "-o", "json")
    if dry_run:
        args.append("--dry-run=server")
    return subprocess.run(args, input=json.dumps(pod), capture_output=True, text=True, timeout=60)


def stored(cluster: kube.Cluster, created: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The pod as the API server stored it (read back, not the create response)."""
    assert created.returncode == 0, created.stderr
    meta = json.loads(created.stdout)["metadata"]
    pod: dict[str, Any] = get_json(cluster, "pod", meta["name"], "-n", meta["namespace"])
    return pod


def register(cluster: kube.Cluster, overlay: str, injector: Injector, bundle: bytes) -> list[str]:
    """Apply the overlay's MutatingWebhookConfiguration with clientConfig pointing at the
    local injector; its failurePolicies."""
    webhooks = copy.deepcopy(find(render(overlay), "MutatingWebhookConfiguration", "ds-injector"))
    webhooks["metadata"].pop("annotations", None)  # cert-manager's: the test is the CA here
    for hook in webhooks["webhooks"]:
        hook["clientConfig"] = {
            "url": injector.url,
            "caBundle": base64.b64encode(bundle).decode(),
        }
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps(webhooks))  # fmt: skip
    return [hook["failurePolicy"] for hook in webhooks["webhooks"]]


def namespace(cluster: kube.Cluster, name: str, labels: dict[str, str]) -> None:
    doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    # The ServiceAccount admission plugin refuses pods until the controllers made "default".
    wait_for(
        lambda: "default" in cluster.kubectl("get", "sa", "default", "-n", name, check=False),
        f"service account {name}/default",
    )


def webhook_in_effect(cluster: kube.Cluster) -> bool:
    """The API server calls the current configuration: a dry-run pod comes back injected."""
    created = create_pod(cluster, app_pod(OPTED_IN), dry_run=True)
    return created.returncode == 0 and injected(json.loads(created.stdout))


@pytest.fixture(scope="module")
def namespaces(cluster: kube.Cluster) -> None:
    namespace(cluster, OPTED_IN, {"dataservice.io/inject": "true"})
    namespace(cluster, OTHER, {})


def test_a_pod_in_an_opted_in_namespace_is_stored_with_the_sidecar(
    cluster: kube.Cluster, injector: Injector, webhook_ca: WebhookCa, namespaces: None
) -> None:
    register(cluster, "dev", injector, webhook_ca.pem)
    wait_for(lambda: webhook_in_effect(cluster), "the webhook configuration in effect")

    pod = stored(cluster, create_pod(cluster, app_pod(OPTED_IN)))
    assert injected(pod)
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == SIDECAR_NAME)
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    app = next(c for c in pod["spec"]["containers"] if c["name"] == "app")
    assert {"DS_SIDECAR", "DS_GROUP"} <= {e["name"] for e in app.get("env", [])}
    print(f"\nstored pod {OPTED_IN}/{pod['metadata']['name']}: initContainers "
          f"{[c['name'] for c in pod['spec']['initContainers']]}, "
          f"containers {[c['name'] for c in pod['spec']['containers']]}")  # fmt: skip

    plain = stored(cluster, create_pod(cluster, app_pod(OTHER)))
    assert not injected(plain)
    print(f"stored pod {OTHER}/{plain['metadata']['name']}: initContainers "
          f"{[c['name'] for c in plain['spec'].get('initContainers') or []]}")  # fmt: skip

    # The second webhook: a pod that opts in by its own label, in a namespace that did not.
    labelled = stored(
        cluster, create_pod(cluster, app_pod(OTHER, {"dataservice.io/inject": "true"}))
    )
    assert injected(labelled)
    # And a pod that opts out in an opted-in namespace is left alone.
    opted_out = stored(
        cluster, create_pod(cluster, app_pod(OPTED_IN, {"dataservice.io/inject": "false"}))
    )
    assert not injected(opted_out)


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_with_the_injector_down_the_failure_policy_decides(
    cluster: kube.Cluster,
    injector: Injector,
    webhook_ca: WebhookCa,
    namespaces: None,
    overlay: str,
) -> None:
    """dev (Ignore): a pod that should get the sidecar is created without it. prod (Fail):
    its creation is refused, so no pod ever runs without the sidecar it asked for. Pods
    that did not opt in are not affected either way (the webhook is not called for them)."""
    policies = register(cluster, overlay, injector, webhook_ca.pem)
    assert len(set(policies)) == 1
    policy = policies[0]
    wait_for(lambda: webhook_in_effect(cluster), "the webhook configuration in effect")
    injector.stop()
    try:
        created = create_pod(cluster, app_pod(OPTED_IN))
        if policy == "Ignore":
            assert not injected(stored(cluster, created))
            print(f"\n{overlay}: failurePolicy Ignore, injector down: pod created WITHOUT sidecar")
        else:
            assert policy == "Fail"
            assert created.returncode != 0
            assert "failed calling webhook" in created.stderr, created.stderr
            print(f"\n{overlay}: failurePolicy Fail, injector down: {created.stderr.strip()}")
        assert created.returncode == (0 if policy == "Ignore" else 1)
        unaffected = stored(cluster, create_pod(cluster, app_pod(OTHER)))
        assert not injected(unaffected)
    finally:
        injector.start(webhook_ca.pem)
    assert injected(stored(cluster, create_pod(cluster, app_pod(OPTED_IN))))


def presented_serial(port: int, trust: bytes) -> int:
    context = ssl.create_default_context(cadata=trust.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


class PodStream:
    """Creates pods in the opted-in namespace one after another until stopped, recording
    each creation: (returncode, stderr, injected)."""

    def __init__(self, cluster: kube.Cluster) -> None:
        self.cluster = cluster
        self.results: list[tuple[int, str, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            created = create_pod(self.cluster, app_pod(OPTED_IN))
            ok = created.returncode == 0 and injected(json.loads(created.stdout))
            self.results.append((created.returncode, created.stderr, ok))

    def wait_for_more(self, n: int) -> None:
        start = len(self.results)
        wait_for(lambda: len(self.results) >= start + n, f"{n} more pod creations", 120)

    def __enter__(self) -> PodStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def test_the_webhook_certificate_rotates_with_no_failed_admission(
    cluster: kube.Cluster, injector: Injector, webhook_ca: WebhookCa, namespaces: None
) -> None:
    """prod's failurePolicy Fail, so a TLS failure would show as a refused pod: the serving
    certificate is replaced in place twice (as cert-manager renews it: same CA, new key)
    while pods are created back to back, and every creation succeeds with the sidecar."""
    register(cluster, "prod", injector, webhook_ca.pem)
    wait_for(lambda: webhook_in_effect(cluster), "the webhook configuration in effect")
    serials = [presented_serial(injector.port, webhook_ca.pem)]
    with PodStream(cluster) as stream:
        stream.wait_for_more(3)
        for _ in range(2):
            new = webhook_ca.issue(injector.tls_dir)
            wait_for(
                lambda new=new: presented_serial(injector.port, webhook_ca.pem) == new,
                "the injector presenting the new certificate",
            )
            serials.append(new)
            stream.wait_for_more(3)
    failures = [(rc, err) for rc, err, ok in stream.results if not ok]
    print(f"\ncertificate serials {[hex(s) for s in serials]}: {len(stream.results)} pods "
          f"created during the rotations, {len(failures)} failed")  # fmt: skip
    assert len(set(serials)) == 3
    assert failures == []
