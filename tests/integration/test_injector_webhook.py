"""ds-injector as a real process over real HTTPS: AdmissionReview documents posted to it are
answered with a JSONPatch that, applied (the jsonpatch package), gives exactly the pod that
``dsctl inject`` writes for the same pod template, and that Kubernetes' schemas accept. Its
certificate is re-read when the files change; bad requests are refused; SIGTERM stops it."""

from __future__ import annotations

import base64
import copy
import datetime
import http.client
import ipaddress
import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.devstack.ports import free_ports
from tests.support.k8s import EXAMPLES, validate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_TEXT = (
    "image: registry.example/dataservice-mesh:0.1.0\n"
    "bootstrap: kafka-0.kafka:9092,kafka-1.kafka:9092\n"
    "consul: $(HOST_IP):8500\n"
    "env:\n  DS_BUFFER_MAX_BYTES: '134217728'\n"
)


def write_certificate(directory: Path, name: str = "ds-injector") -> int:
    """A self-signed serving certificate for 127.0.0.1 (tls.crt, tls.key); its serial."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Key first, then certificate: a reader between the two writes sees a mismatched pair
    # and must keep the old one (the injector retries on the next connection).
    (directory / "tls.key").write_bytes(key_pem)
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return int(cert.serial_number)


@dataclass
class Injector:
    proc: subprocess.Popen[bytes]
    port: int
    tls_dir: Path
    log: Path

    def connection(self) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.tls_dir / "tls.crt"))
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=10)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, int]:
        """Status, body and the serial of the certificate the server presented."""
        conn = self.connection()
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            peer = conn.sock.getpeercert(binary_form=True)  # type: ignore[union-attr]
            assert peer is not None
            serial = x509.load_der_x509_certificate(peer).serial_number
            return response.status, response.read(), serial
        finally:
            conn.close()

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        status, body, _ = self.request("POST", "/inject", json.dumps(review).encode())
        assert status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]


@pytest.fixture
def injector(tmp_path: Path) -> Iterator[Injector]:
    tls = tmp_path / "tls"
    tls.mkdir()
    write_certificate(tls)
    template = tmp_path / "sidecar.yaml"
    template.write_text(TEMPLATE_TEXT)
    (port,) = free_ports(1)
    log = tmp_path / "injector.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "services.injector", "--port", str(port),
                "--cert-file", str(tls / "tls.crt"), "--key-file", str(tls / "tls.key"),
                "--template", str(template), "--log-format", "console",
            ],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
    running = Injector(proc, port, tls, log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if running.request("GET", "/healthz")[0] == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def review_of(pod: dict[str, Any], uid: str = "a1b2c3") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def patched(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    response = answer["response"]
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(pod), operations)  # type: ignore[no-any-return]


def dsctl_inject(manifest: Path, template: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "services.dsctl", "inject", "-f", str(manifest),
         "--template", str(template)],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def pod_of(deployment: dict[str, Any]) -> dict[str, Any]:
    """The pod a ReplicaSet creates from a Deployment's template, as the API server sends it
    to a webhook (defaults aside)."""
    template = deployment["spec"]["template"]
    metadata = {**template["metadata"], "generateName": "orders-consumer-5c8d7f9b4-"}
    metadata["namespace"] = deployment["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def test_the_webhook_patch_equals_dsctl_inject(injector: Injector, tmp_path: Path) -> None:
    manifest = EXAMPLES / "app.yaml"
    deployment = yaml.safe_load_all(manifest.read_text()).__next__()
    pod = pod_of(deployment)
    answer = injector.review(review_of(pod, uid="705ab4f5-6393-11e8"))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8"
    assert answer["response"]["allowed"] is True
    webhook_pod = patched(pod, answer)

    injected = dsctl_inject(manifest, tmp_path / "sidecar.yaml")[0]
    assert webhook_pod == pod_of(injected)
    assert validate(webhook_pod) is None
    sidecar = webhook_pod["spec"]["initContainers"][0]
    assert sidecar["image"] == "registry.example/dataservice-mesh:0.1.0"
    assert {"name": "DS_CONSUL", "value": "$(HOST_IP):8500"} in sidecar["env"]

    # A pod that is already injected (dsctl inject, or a re-invocation) gets no patch.
    again = injector.review(review_of(webhook_pod))
    assert again["response"] == {"uid": "a1b2c3", "allowed": True}


def test_opt_out_missing_group_and_other_operations(injector: Injector) -> None:
    base = pod_of(yaml.safe_load_all((EXAMPLES / "app.yaml").read_text()).__next__())
    opted_out = copy.deepcopy(base)
    opted_out["metadata"]["annotations"]["dataservice.io/inject"] = "false"
    assert injector.review(review_of(opted_out))["response"] == {"uid": "a1b2c3", "allowed": True}

    no_group = copy.deepcopy(base)
    del no_group["metadata"]["annotations"]["dataservice.io/group"]
    response = injector.review(review_of(no_group))["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "dataservice.io/group" in response["warnings"][0]

    update = review_of(base)
    update["request"]["operation"] = "UPDATE"
    assert injector.review(update)["response"] == {"uid": "a1b2c3", "allowed": True}

    status, body, _ = injector.request("GET", "/metrics")
    metrics = body.decode()
    assert status == 200
    assert 'ds_injector_reviews_total{action="skipped"} 2.0' in metrics
    assert 'ds_injector_reviews_total{action="failed"} 1.0' in metrics


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/inject", b"not json", 400),
        ("POST", "/inject", b'{"apiVersion": "admission.k8s.io/v1beta1"}', 400),
        ("POST", "/mutate", b"{}", 404),
        ("GET", "/inject", None, 404),
    ],
)
def test_bad_requests_are_refused(
    injector: Injector, method: str, path: str, body: bytes | None, status: int
) -> None:
    assert injector.request(method, path, body)[0] == status
    assert injector.request("GET", "/healthz")[0] == 200


def test_a_rotated_certificate_is_served_without_a_restart(injector: Injector) -> None:
    _, _, before = injector.request("GET", "/healthz")
    time.sleep(0.05)  # a different mtime even on coarse clocks
    serial = write_certificate(injector.tls_dir)
    assert serial != before
    _, _, after = injector.request("GET", "/healthz")
    assert after == serial
    assert "certificate reloaded" in injector.log.read_text()


def test_sigterm_stops_it(injector: Injector) -> None:
    injector.proc.send_signal(signal.SIGTERM)
    assert injector.proc.wait(timeout=10) == 0
    assert "stopped" in injector.log.read_text()
