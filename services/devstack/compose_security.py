"""The compose stack's security: its PKI, secure by default, and the plaintext switch.

deploy/docker-compose.yml runs every mesh service with TLS and mTLS on its gRPC and HTTP
ports, a bearer token of its own and authorization on (``identity_from: token``), as
``dsctl dev up --secure`` does (:mod:`services.devstack.secure`). :func:`make_compose_pki`
makes the files on the host, fresh at every ``python -m services.devstack.compose up``, into
``deploy/.compose/pki`` (or ``$DS_COMPOSE_PKI``), which the compose file mounts read-only
at :data:`PKI_MOUNT` in every mesh container, in Consul (its certificate for the gRPC health
checks of TLS ports) and in Prometheus (its certificate for the mTLS scrapes):

* ``ca.pem``; ``NAME.pem`` / ``NAME.key`` for each identity (:data:`CERTIFICATES`);
* ``NAME.jwt`` (audiences ds-assigner, ds-notifier) and ``NAME.sidecar.jwt`` (ds-sidecar)
  for each identity of :func:`compose_roles`; ``jwt.pub``; ``policy.yaml``.

The signing keys (``ca.key``, ``jwt.key``) are moved out of the mounted directory, to its
parent (mode 0700): no container can mint a certificate or a token. The containers run as
their own users, so the mounted files are world-readable (0644) inside a 0700 parent.

``--plaintext`` (``make compose-up PLAINTEXT=1``): the developer's opt-in. The same PKI is
mounted, but ``DS_PLAINTEXT=1`` makes the image's entry point drop every ``DS_TLS__*`` and
``DS_AUTH__*`` variable, and Prometheus gets :func:`plaintext_prometheus` of the compose
configuration (plain HTTP scrapes).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from services.devstack import podman, secure
from services.devstack.consul import CHECK_CERTIFICATE
from services.devstack.pki import DevPki, make_dev_pki

GROUP = "orders-demo"  # the group deploy/docker-compose.yml declares
SIDECARS = ("sidecar-a", "sidecar-b")
APPS = ("demo-a", "demo-b")
# Where the compose file mounts the PKI directory in the containers that use it.
PKI_MOUNT = "/var/run/dataservice/pki"
# What the operator's tools (dsctl, grpcurl, the tests) present: a certificate with no role
# of its own, beside a token (admin.jwt, viewer.jwt).
CLIENT = secure.CLIENT_CERTIFICATE
# Consul's: for its gRPC health checks of the TLS ports (consul.check_tls_args).
CERTIFICATES = ("assigner", "notifier", *SIDECARS, *APPS, CLIENT, "prometheus", CHECK_CERTIFICATE)
SIGNING_KEYS = ("ca.key", "jwt.key")


def compose_roles(group: str = GROUP) -> dict[str, list[str]]:
    """Who may do what in the compose stack (the policy file's identities)."""
    roles: dict[str, list[str]] = {
        # Both assigner replicas are the identity "assigner": reports faults, /ui views.
        "assigner": ["reporter", "viewer"],
        "notifier": ["reporter", "viewer"],
        # The operator (dsctl describe, ...) and a read-only operator.
        "admin": ["admin"],
        "viewer": ["viewer"],
    }
    for sidecar in SIDECARS:
        # Its own Session, in its group only; its faults.
        roles[sidecar] = ["sidecar", f"serves:{group}", "reporter", "viewer"]
    for app in APPS:
        roles[app] = [f"reader:{group}"]  # Bind at the assigner, Fetch and Ack at the sidecars
    return roles


def pki_dir() -> Path:
    """``$DS_COMPOSE_PKI``, else ``deploy/.compose/pki`` (the compose file's default)."""
    configured = os.environ.get("DS_COMPOSE_PKI")
    return Path(configured) if configured else podman.REPO / "deploy" / ".compose" / "pki"


def make_compose_pki(directory: Path | None = None) -> DevPki:
    """A fresh CA, certificates, tokens and policy in ``directory`` (default
    :func:`pki_dir`), readable by the containers' users, the signing keys moved out."""
    directory = directory or pki_dir()
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o700)
    shutil.rmtree(directory, ignore_errors=True)
    pki = make_dev_pki(directory, compose_roles(), certificates=CERTIFICATES)
    for name in SIGNING_KEYS:
        (directory / name).replace(parent / name)  # stays 0600
    directory.chmod(0o755)
    for file in directory.iterdir():
        file.chmod(0o644)
    return pki


def signing_key(pki: DevPki, name: str = "jwt.key") -> Path:
    """Where :func:`make_compose_pki` put a signing key (beside the mounted directory)."""
    return pki.directory.parent / name


def client_env(pki: DevPki, token: str = "admin") -> dict[str, str]:
    """The ``DS_TLS__*`` variables of a tool on the host (dsctl): the client certificate
    and ``token``'s tokens."""
    return secure.tls_env(pki, CLIENT, token)


def plaintext_prometheus(config: Mapping[str, Any]) -> dict[str, Any]:
    """The compose Prometheus configuration with its mTLS scrapes made plain HTTP (every
    job's ``scheme: https`` and ``tls_config`` dropped)."""
    plain = dict(config)
    jobs = []
    for job in config.get("scrape_configs", []):
        job = dict(job)
        if job.get("scheme") == "https":
            job.pop("scheme")
            job.pop("tls_config", None)
        jobs.append(job)
    plain["scrape_configs"] = jobs
    return plain


def write_plaintext_prometheus(secure_config: Path, directory: Path) -> Path:
    """:func:`plaintext_prometheus` of ``secure_config``, written (world-readable) into
    ``directory``."""
    config = yaml.safe_load(secure_config.read_text())
    path = directory / "prometheus-plaintext.yml"
    path.write_text(yaml.safe_dump(plaintext_prometheus(config), sort_keys=False))
    path.chmod(0o644)
    return path
