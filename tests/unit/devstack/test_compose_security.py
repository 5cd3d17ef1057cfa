"""The compose stack's PKI, its plaintext switch, and the image's health check over TLS
(pure parts and files; the stack itself: tests/compose)."""

from __future__ import annotations

import importlib.util
import ssl
import stat
import urllib.request
from pathlib import Path
from types import ModuleType

import jwt
import pytest
import yaml
from prometheus_client import CollectorRegistry

from dsclient.connection import TlsConfig
from services.devstack import compose_security, podman
from services.devstack.consul import check_tls_args
from services.devstack.pki import DevPki
from services.runtime.http import HttpEndpoint

REPO = podman.REPO


def _healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "ds_healthcheck", REPO / "deploy" / "container" / "healthcheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pki_is_readable_by_the_containers_and_holds_no_signing_key(tmp_path: Path) -> None:
    pki = compose_security.make_compose_pki(tmp_path / "compose" / "pki")
    mounted = {p.name: stat.S_IMODE(p.stat().st_mode) for p in pki.directory.iterdir()}
    assert set(mounted.values()) == {0o644}
    assert stat.S_IMODE(pki.directory.stat().st_mode) == 0o755
    assert stat.S_IMODE(pki.directory.parent.stat().st_mode) == 0o700
    for name in compose_security.SIGNING_KEYS:
        assert name not in mounted
        assert stat.S_IMODE((pki.directory.parent / name).stat().st_mode) == 0o600
    for name in compose_security.CERTIFICATES:
        assert {f"{name}.pem", f"{name}.key"} <= set(mounted)
    # Every identity of the policy has its two tokens, signed by the key beside the mount.
    policy = yaml.safe_load(pki.policy.read_text())["identities"]
    assert policy == compose_security.compose_roles()
    public = pki.jwt_public_key.read_bytes()
    for name in policy:
        claims = jwt.decode(
            pki.token(name).read_text(), public, algorithms=["ES256"], audience="ds-assigner"
        )
        assert claims["sub"] == name
        assert (
            jwt.decode(
                pki.sidecar_token(name).read_text(),
                public,
                algorithms=["ES256"],
                audience="ds-sidecar",
            )["sub"]
            == name
        )


def test_a_new_pki_replaces_the_old_one(tmp_path: Path) -> None:
    first = compose_security.make_compose_pki(tmp_path / "pki")
    ca = first.ca.read_bytes()
    (first.directory / "stale.pem").write_text("x")
    second = compose_security.make_compose_pki(tmp_path / "pki")
    assert second.ca.read_bytes() != ca
    assert not (second.directory / "stale.pem").exists()


def test_the_roles_scope_each_identity() -> None:
    roles = compose_security.compose_roles()
    assert roles["sidecar-a"] == ["sidecar", "serves:orders-demo", "reporter", "viewer"]
    assert roles["demo-b"] == ["reader:orders-demo"]
    assert roles["admin"] == ["admin"]
    assert "client" not in roles  # a certificate only: a tool's identity is its token


def test_plaintext_prometheus_drops_only_the_mtls_of_the_mesh_jobs() -> None:
    secure = yaml.safe_load((REPO / "deploy/prometheus/prometheus-compose.yml").read_text())
    https = {j["job_name"] for j in secure["scrape_configs"] if j.get("scheme") == "https"}
    assert https == {"ds-assigner", "ds-sidecar", "ds-notifier", "demo-app"}
    plain = compose_security.plaintext_prometheus(secure)
    for job in plain["scrape_configs"]:
        assert "scheme" not in job and "tls_config" not in job
    assert [j["static_configs"] for j in plain["scrape_configs"]] == [
        j["static_configs"] for j in secure["scrape_configs"]
    ]
    assert {k: v for k, v in plain.items() if k != "scrape_configs"} == {
        k: v for k, v in secure.items() if k != "scrape_configs"
    }


def test_the_compose_file_is_secure_unless_the_developer_opts_out() -> None:
    compose = yaml.safe_load((REPO / "deploy/docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if service.get("image") != "dataservice-mesh:dev":
            continue
        env = service["environment"]
        assert env["DS_PLAINTEXT"] == "${DS_PLAINTEXT:-0}", name
        assert env["DS_TLS__CLIENT_AUTH"] == "require", name
        assert env["DS_AUTH__ENABLED"] == "true", name
        identity = Path(env["DS_TLS__CERT_FILE"]).stem
        assert env["DS_TLS__TOKEN_FILE"].endswith(f"/{identity}.jwt"), name
        assert identity in compose_security.CERTIFICATES, name
        assert any(v.endswith(":/var/run/dataservice/pki:ro") for v in service["volumes"]), name


def test_the_compose_consul_checks_with_the_certificate_dev_up_gives_its_agent() -> None:
    """Compose's Consul presents the mounted PKI's consul certificate in its gRPC checks of
    the mTLS ports with the arguments ``dsctl dev up --secure --with-consul`` gives its
    agent (one definition: consul.check_tls_args)."""
    compose = yaml.safe_load((REPO / "deploy/docker-compose.yml").read_text())
    command = compose["services"]["consul"]["command"]
    args = check_tls_args(DevPki(Path(compose_security.PKI_MOUNT)))
    assert [a for a in command if a.startswith("-hcl=")] == args
    assert "consul" in compose_security.CERTIFICATES


def test_the_health_check_probes_https_with_the_services_certificate() -> None:
    check = _healthcheck()
    argv = ["/opt/venv/bin/python", "/opt/venv/bin/ds-assigner"]
    env = {"DS_HTTP_PORT": "7171", "DS_HOST": "127.0.0.1"}
    assert check.healthz_url(argv, env) == "http://127.0.0.1:7171/healthz"
    assert check.tls_context(env) is None
    secure = {**env, "DS_TLS__CERT_FILE": "/pki/assigner.pem"}
    assert check.healthz_url(argv, secure) == "https://127.0.0.1:7171/healthz"


def test_the_health_check_passes_an_mtls_port_with_the_services_own_certificate(
    tmp_path: Path,
) -> None:
    """A real HTTP endpoint requiring client certificates: the check's context (the
    service's CA and certificate) gets /healthz; without a certificate it is refused."""
    pki = compose_security.make_compose_pki(tmp_path / "pki")
    tls = TlsConfig(
        ca_file=pki.ca,
        cert_file=pki.cert("assigner"),
        key_file=pki.key("assigner"),
        client_auth="require",
    )
    http = HttpEndpoint(
        "127.0.0.1", 0, CollectorRegistry(), lambda: (True, {"service": "x"}), tls=tls
    )
    http.start()
    try:
        check = _healthcheck()
        env = {
            "DS_HTTP_PORT": str(http.port),
            "DS_TLS__CA_FILE": str(pki.ca),
            "DS_TLS__CERT_FILE": str(pki.cert("assigner")),
            "DS_TLS__KEY_FILE": str(pki.key("assigner")),
        }
        url = check.healthz_url(["ds-assigner"], env)
        with urllib.request.urlopen(url, timeout=5, context=check.tls_context(env)) as response:
            assert response.status == 200
        no_cert = ssl.create_default_context(cafile=str(pki.ca))
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=5, context=no_cert)
    finally:
        http.stop()
