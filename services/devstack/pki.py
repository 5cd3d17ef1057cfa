"""A development PKI for ``dsctl dev up --secure``: a CA, certificates, a token key, tokens.

Everything is made with ``cryptography`` (EC P-256 keys, X.509 v3) and PyJWT (ES256), in
one directory, files 0600:

* ``ca.pem`` / ``ca.key``: the CA every service and client trusts;
* ``NAME.pem`` / ``NAME.key`` for each identity: a certificate whose subject common name is
  NAME, valid for ``localhost`` and 127.0.0.1 as a server and as a client (mTLS);
* ``jwt.pub`` / ``jwt.key``: the key tokens are signed with and verified against;
* ``NAME.jwt``: a token whose subject is NAME for the control plane (audiences
  ``ds-assigner`` and ``ds-notifier``, a day), and ``NAME.sidecar.jwt``, the same for the
  sidecars (audience ``ds-sidecar``): each service accepts only tokens naming its own
  audience, so a token sent to a sidecar cannot be replayed at the assigner or the
  notifier, nor a control-plane token at a sidecar (issue 37);
* ``policy.yaml``: the roles of each identity (:func:`write_policy`).

Nothing here is fit for production: the CA key sits beside the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Each service's audience is its discovery name (auth.jwt_audience's default).
ASSIGNER_AUDIENCE = "ds-assigner"
NOTIFIER_AUDIENCE = "ds-notifier"
SIDECAR_AUDIENCE = "ds-sidecar"
AUDIENCES = (ASSIGNER_AUDIENCE, NOTIFIER_AUDIENCE, SIDECAR_AUDIENCE)
# NAME.jwt: what an identity sends to the assigner and the notifier.
CONTROL_AUDIENCES = (ASSIGNER_AUDIENCE, NOTIFIER_AUDIENCE)
TOKEN_ISSUER = "dsctl-dev"
# A day: the services' default jwt_max_lifetime_seconds (issue 37, finding 12); `dsctl dev
# up --secure` mints them afresh.
TOKEN_DAYS = 1
CERT_DAYS = 30


@dataclass(frozen=True)
class DevPki:
    """Where the files of one development PKI are."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def jwt_public_key(self) -> Path:
        return self.directory / "jwt.pub"

    @property
    def policy(self) -> Path:
        return self.directory / "policy.yaml"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def token(self, name: str) -> Path:
        """NAME's token for the control plane (the assigner, the notifier)."""
        return self.directory / f"{name}.jwt"

    def sidecar_token(self, name: str) -> Path:
        """NAME's token for the sidecars (what an application sends to its sidecar)."""
        return self.directory / f"{name}.sidecar.jwt"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dataservice dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(pki: DevPki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("dataservice dev CA")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(pki.ca, cert.public_bytes(serialization.Encoding.PEM))
    _write(pki.directory / "ca.key", _key_pem(key))
    return cert, key


def issue(
    pki: DevPki,
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
) -> None:
    """``NAME.pem`` / ``NAME.key``: subject CN=NAME, a server and client certificate."""
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.cert(name), cert.public_bytes(serialization.Encoding.PEM))
    _write(pki.key(name), _key_pem(key))


def make_token_key(pki: DevPki) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    _write(pki.directory / "jwt.key", _key_pem(key))
    _write(
        pki.jwt_public_key,
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return key


def sign_token(
    key: ec.EllipticCurvePrivateKey,
    subject: str,
    *,
    audiences: Sequence[str] = CONTROL_AUDIENCES,
    days: float = TOKEN_DAYS,
) -> str:
    """A token naming ``subject``, accepted by the services of ``audiences`` only."""
    if not audiences:
        raise ValueError("a token names at least one audience")
    now = _now()
    claims = {
        "sub": subject,
        "aud": list(audiences),
        "iss": TOKEN_ISSUER,
        "iat": now,
        "exp": now + datetime.timedelta(days=days),
    }
    return jwt.encode(claims, key, algorithm="ES256")


def write_policy(pki: DevPki, roles: Mapping[str, Sequence[str]]) -> None:
    _write(
        pki.policy, yaml.safe_dump({"identities": {k: list(v) for k, v in roles.items()}}).encode()
    )


def make_dev_pki(
    directory: Path,
    roles: Mapping[str, Sequence[str]],
    *,
    certificates: Sequence[str],
) -> DevPki:
    """A fresh CA, a certificate for each of ``certificates``, a token for each identity of
    ``roles`` and the policy giving them those roles."""
    pki = DevPki(directory)
    ca = make_ca(pki)
    for name in certificates:
        issue(pki, name, ca)
    token_key = make_token_key(pki)
    for name in roles:
        _write(pki.token(name), sign_token(token_key, name).encode())
        sidecar = sign_token(token_key, name, audiences=[SIDECAR_AUDIENCE])
        _write(pki.sidecar_token(name), sidecar.encode())
    write_policy(pki, roles)
    return pki
