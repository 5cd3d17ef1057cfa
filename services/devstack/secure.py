"""What ``dsctl dev up --secure`` runs with: a fresh development PKI, tokens and a policy,
and the ``DS_TLS__*`` / ``DS_AUTH__*`` variables each process of the stack gets.

Every gRPC and HTTP port serves TLS and requires a client certificate signed by the dev CA
(mTLS); every caller is named by its bearer token (``identity_from: token``), services
included, so the policy below is the whole story of who may do what. The operator's
tools (dsctl, grpcurl, an application) connect with the ``client`` certificate (CN
``dev-client``, no role of its own) and one of the tokens: ``admin.jwt``, ``viewer.jwt``,
``reader-demo.jwt`` for the assigner and the notifier, ``NAME.sidecar.jwt`` for sidecars.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from services.devstack.consul import CHECK_CERTIFICATE
from services.devstack.pki import TOKEN_ISSUER, DevPki, make_dev_pki

CLIENT_CERTIFICATE = "client"


def stack_roles(sidecars: Mapping[str, str], probe_group: str) -> dict[str, list[str]]:
    """Who may do what in the dev stack."""
    roles: dict[str, list[str]] = {
        # Reports its faults; its /ui reads the notifier's recent faults.
        "assigner": ["reporter", "viewer"],
        # The probe creates its group (admin) and reads it through its sidecar.
        "notifier": ["reporter", "viewer", "admin", f"reader:{probe_group}"],
        # The operator (dsctl), a read-only operator, and an application of group demo.
        "admin": ["admin"],
        "viewer": ["viewer"],
        "reader-demo": ["reader:demo"],
    }
    for name, group in sidecars.items():
        # Its own Session and Leave, in its group only (its scope: issue 37, finding 1);
        # its faults; its group's topics (kafka_group mode).
        roles[name] = ["sidecar", f"serves:{group}", "reporter", "viewer"]
    return roles


def make_stack_pki(directory: Path, sidecars: Mapping[str, str], probe_group: str) -> DevPki:
    """The stack's PKI, tokens and policy; ``sidecars`` maps each sidecar to its group."""
    services = ["assigner", "notifier", *sidecars]
    return make_dev_pki(
        directory,
        stack_roles(sidecars, probe_group),
        # Consul's, for its health checks of the mTLS ports (with --with-consul).
        certificates=[*services, CLIENT_CERTIFICATE, CHECK_CERTIFICATE],
    )


def tls_env(pki: DevPki, certificate: str, token: str | None) -> dict[str, str]:
    """The ``DS_TLS__*`` variables of a client (or a service's own channels)."""
    env = {
        "DS_TLS__CA_FILE": str(pki.ca),
        "DS_TLS__CERT_FILE": str(pki.cert(certificate)),
        "DS_TLS__KEY_FILE": str(pki.key(certificate)),
    }
    if token is not None:
        # The control plane's token, and the one sent to sidecars (audiences: issue 37).
        env["DS_TLS__TOKEN_FILE"] = str(pki.token(token))
        env["DS_TLS__SIDECAR_TOKEN_FILE"] = str(pki.sidecar_token(token))
    return env


def service_env(pki: DevPki, name: str) -> Mapping[str, str]:
    """A service of the stack: its certificate for its servers and its channels, mTLS
    required, its token, and authorization on."""
    return {
        **tls_env(pki, name, name),
        "DS_TLS__CLIENT_AUTH": "require",
        "DS_AUTH__ENABLED": "true",
        "DS_AUTH__POLICY_FILE": str(pki.policy),
        "DS_AUTH__IDENTITY_FROM": "token",
        "DS_AUTH__JWT_KEY_FILE": str(pki.jwt_public_key),
        "DS_AUTH__JWT_ISSUER": TOKEN_ISSUER,
    }
