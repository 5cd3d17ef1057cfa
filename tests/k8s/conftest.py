"""tests/k8s: a real Kubernetes API server (etcd, kube-apiserver, kube-controller-manager;
services/devstack/kube.py), started once per session, and the injector as a local process
the API server calls through the manifests' own MutatingWebhookConfiguration."""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.devstack import kube, procs
from services.devstack.ports import free_ports
from tests.support import waiting
from tests.support.k8s import find, render

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "k8s" / "base" / "config" / "sidecar.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube.Cluster]:
    directory = tmp_path_factory.mktemp("k8s")
    running = kube.up(directory / "cluster")
    try:
        yield running
    finally:
        kube.down(directory / "cluster")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class WebhookCa:
    """A CA that signs the injector's serving certificates; its PEM is the caBundle."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, directory: Path) -> int:
        """A serving certificate for 127.0.0.1 written as tls.key then tls.crt (a reader
        between the two sees a mismatched pair and keeps the old one); its serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ds-injector")]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tls.key").write_bytes(_key_pem(key))
        (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return int(cert.serial_number)


@dataclass
class Injector:
    """ds-injector as a local process on 127.0.0.1, its certificate in ``tls_dir``."""

    port: int
    tls_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    template: Path = TEMPLATE  # the sidecar template it injects (base's by default)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/inject"

    def start(self, trust: bytes) -> None:
        """Start it and wait for /healthz (verified against ``trust``, a CA PEM)."""
        self.proc = procs.spawn(
            [
                sys.executable, "-m", "services.injector", "--host", "127.0.0.1",
                "--port", str(self.port), "--cert-file", str(self.tls_dir / "tls.crt"),
                "--key-file", str(self.tls_dir / "tls.key"), "--template", str(self.template),
                "--log-format", "console",
            ],
            self.log,
            cwd=REPO,
        )  # fmt: skip
        context = ssl.create_default_context(cadata=trust.decode())

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{self.port}/healthz", context=context, timeout=5
                ) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        proc = self.proc
        procs.wait_until(
            healthy,
            timeout=60,
            what="ds-injector /healthz",
            alive=lambda: None if proc.poll() is None else procs.log_tail(self.log),
        )

    def stop(self) -> None:
        if self.proc is not None:
            procs.terminate(self.proc)
            self.proc = None


@pytest.fixture(scope="module")
def webhook_ca() -> WebhookCa:
    return WebhookCa("ds-injector test CA")


@pytest.fixture(scope="module")
def injector(tmp_path_factory: pytest.TempPathFactory, webhook_ca: WebhookCa) -> Iterator[Injector]:
    directory = tmp_path_factory.mktemp("injector")
    webhook_ca.issue(directory / "tls")
    (port,) = free_ports(1)
    running = Injector(port=port, tls_dir=directory / "tls", log=directory / "injector.log")
    running.start(webhook_ca.pem)
    try:
        yield running
    finally:
        running.stop()


def wait_for(check: Any, what: str, timeout: float = 60.0, interval: float = 0.5) -> Any:
    """Poll ``check()`` until it returns something truthy; that value (the shared
    :func:`tests.support.waiting.wait_for`, with the cluster's patience by default)."""
    return waiting.wait_for(check, timeout, what, every=interval)


def get_json(cluster: kube.Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


@pytest.fixture(scope="module")
def prod_injector(
    cluster: kube.Cluster, tmp_path_factory: pytest.TempPathFactory, webhook_ca: WebhookCa
) -> Iterator[Injector]:
    """The injector with the prod overlay's template, registered by the prod overlay's
    MutatingWebhookConfiguration (clientConfig pointed at it, the test CA as caBundle)."""
    directory = tmp_path_factory.mktemp("wid-injector")
    docs = render("prod")
    template = directory / "sidecar.yaml"
    template.write_text(find(docs, "ConfigMap", "ds-sidecar-template")["data"]["sidecar.yaml"])
    webhook_ca.issue(directory / "tls")
    (port,) = free_ports(1)
    running = Injector(port, directory / "tls", directory / "injector.log", template=template)
    running.start(webhook_ca.pem)
    webhooks = copy.deepcopy(find(docs, "MutatingWebhookConfiguration", "ds-injector"))
    webhooks["metadata"].pop("annotations", None)  # cert-manager's: the test is the CA here
    for hook in webhooks["webhooks"]:
        bundle = base64.b64encode(webhook_ca.pem).decode()
        hook["clientConfig"] = {"url": running.url, "caBundle": bundle}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps(webhooks))  # fmt: skip
    try:
        yield running
    finally:
        running.stop()
