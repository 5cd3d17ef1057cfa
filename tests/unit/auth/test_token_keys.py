"""JWT keys (issue 37, finding 12): a key set with ``kid`` verifies tokens of every key it
holds and only those (rotation: add the new key, sign with it, drop the old one), a token
names its key, and no token lives longer than ``jwt_max_lifetime_seconds``."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.runtime.auth.settings import AuthSettings
from services.runtime.auth.tokens import TokenRejected, TokenVerifier

NOW = datetime.datetime.now(datetime.UTC)


def _jwk(key: ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    public: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return public | {"kid": kid, "use": "sig", "alg": "ES256"}


def _token(
    key: ec.EllipticCurvePrivateKey,
    kid: str | None,
    *,
    lifetime: datetime.timedelta = datetime.timedelta(hours=1),
    issued: bool = True,
) -> str:
    claims: dict[str, Any] = {"sub": "ops", "aud": "ds-assigner", "exp": NOW + lifetime}
    if issued:
        claims["iat"] = NOW
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims, key, algorithm="ES256", headers=headers)


class Clock:
    """When the verifier looks at its key file again: moved by the test, not by time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write_set(path: Path, keys: dict[str, ec.EllipticCurvePrivateKey]) -> None:
    path.write_text(json.dumps({"keys": [_jwk(k, kid) for kid, k in keys.items()]}))
    # The file's identity (size, mtime) tells a change: make sure the next one differs.
    stamp = time.time() + len(keys)
    os.utime(path, (stamp, stamp))


def _verifier(path: Path, clock: Clock | None = None, **settings: Any) -> TokenVerifier:
    return TokenVerifier(
        AuthSettings(jwt_key_file=path, **settings), "ds-assigner", clock or Clock()
    )


def _refusal(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(TokenRejected) as refused:
        verifier.identity(token)
    return str(refused.value)


def test_a_key_set_verifies_each_of_its_keys_by_kid_and_rotates(tmp_path: Path) -> None:
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    keys = tmp_path / "jwt.jwks"
    _write_set(keys, {"2026-11": old, "2026-12": new})
    clock = Clock()
    verifier = _verifier(keys, clock)
    assert verifier.identity(_token(old, "2026-11")) == "ops"
    assert verifier.identity(_token(new, "2026-12")) == "ops"
    # a token signed by one key but naming another is refused, so is one naming no key
    wrong = _refusal(verifier, _token(old, "2026-12"))
    nameless = _refusal(verifier, _token(new, None))
    unknown = _refusal(verifier, _token(new, "2025-01"))
    print(f"kid of another key: {wrong}; no kid: {nameless}; unknown kid: {unknown}")
    assert "signature" in wrong.lower()
    assert nameless == "invalid token: no key id (kid)"
    assert unknown == "invalid token: unknown key id 2025-01"
    # rotation done: the old key leaves the set, its tokens stop working at once
    _write_set(keys, {"2026-12": new})
    clock.now += 1.0  # the verifier's next look at the file
    assert verifier.identity(_token(new, "2026-12")) == "ops"
    assert _refusal(verifier, _token(old, "2026-11")) == "invalid token: unknown key id 2026-11"


def test_no_token_lives_longer_than_the_maximum(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    keys = tmp_path / "jwt.jwks"
    _write_set(keys, {"k1": key})
    verifier = _verifier(keys, jwt_max_lifetime_seconds=3600)
    assert verifier.identity(_token(key, "k1", lifetime=datetime.timedelta(hours=1))) == "ops"
    long_lived = _refusal(verifier, _token(key, "k1", lifetime=datetime.timedelta(days=30)))
    undated = _refusal(verifier, _token(key, "k1", issued=False))
    print(f"a 30-day token: {long_lived}; a token without iat: {undated}")
    assert long_lived == "invalid token: lives 2592000 s, more than 3600 s"
    assert "iat" in undated
    assert AuthSettings().jwt_max_lifetime_seconds == 86400


def test_a_single_pem_key_still_verifies_tokens_with_or_without_kid(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "jwt.pub"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    verifier = _verifier(pem)
    assert verifier.identity(_token(key, None)) == "ops"
    assert verifier.identity(_token(key, "any")) == "ops"


def _for(key: ec.EllipticCurvePrivateKey, aud: object) -> str:
    claims: dict[str, Any] = {"sub": "ops", "exp": NOW + datetime.timedelta(hours=1), "iat": NOW}
    if aud is not None:
        claims["aud"] = aud
    return jwt.encode(claims, key, algorithm="ES256")


def test_a_token_is_accepted_only_by_the_services_of_its_audience(tmp_path: Path) -> None:
    """Issue 37: a token a client sent to a sidecar (aud ds-sidecar) replayed at the
    assigner is refused, saying whose token it is; one naming several services is
    accepted by each of them; one naming none is refused everywhere."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "jwt.pub"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    settings = AuthSettings(jwt_key_file=pem)
    assigner = TokenVerifier(settings, "ds-assigner", Clock())
    sidecar = TokenVerifier(settings, "ds-sidecar", Clock())
    notifier = TokenVerifier(settings, "ds-notifier", Clock())
    to_sidecar = _for(key, "ds-sidecar")
    assert sidecar.identity(to_sidecar) == "ops"
    replayed = _refusal(assigner, to_sidecar)
    print("a sidecar's token at the assigner:", replayed)
    assert (
        replayed == "wrong audience: the token is for ds-sidecar, this service accepts ds-assigner"
    )
    assert "accepts ds-notifier" in _refusal(notifier, to_sidecar)
    control = _for(key, ["ds-assigner", "ds-notifier"])
    assert assigner.identity(control) == notifier.identity(control) == "ops"
    assert "wrong audience: the token is for ds-assigner, ds-notifier" in _refusal(sidecar, control)
    assert "aud" in _refusal(assigner, _for(key, None))
    # An operator's own audience (auth.jwt_audience) wins over the service's name.
    custom = TokenVerifier(AuthSettings(jwt_key_file=pem, jwt_audience="mesh"), "ds-assigner")
    assert custom.identity(_for(key, "mesh")) == "ops"
    assert "accepts mesh" in _refusal(custom, control)
