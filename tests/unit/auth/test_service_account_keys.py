"""Service-account tokens verified against a key set (what a sidecar would use instead of a
TokenReview): the claims' rule, and the verifier over tokens signed here with an RSA key
whose public half is the key set (as the API server serves /openid/v1/jwks)."""

from __future__ import annotations

import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from services.runtime.auth import AuthSettings
from services.runtime.auth.service_account_keys import (
    ServiceAccountKeys,
    ServiceAccountKeysSettings,
    claims_subject,
)
from services.runtime.auth.token_review import ReviewRejected, Subject

ACCOUNT = "system:serviceaccount:shop:orders-consumer"
ISSUER = "https://kubernetes.default.svc"
POD = {"name": "orders-7d9f-abcde", "uid": "6c06bdaa-0000"}


def test_the_claims_name_a_service_account_and_its_pod_only_with_both_name_and_uid() -> None:
    assert claims_subject({"sub": ACCOUNT, "kubernetes.io": {"pod": POD}}) == Subject(
        ACCOUNT, "orders-7d9f-abcde"
    )
    assert claims_subject({"sub": ACCOUNT, "kubernetes.io": {"pod": {"name": "p"}}}) == (
        Subject(ACCOUNT)
    )
    assert claims_subject({"sub": ACCOUNT}) == Subject(ACCOUNT)
    for subject in ("alice", "system:serviceaccount:shop", ""):
        with pytest.raises(ReviewRejected, match="not a service account"):
            claims_subject({"sub": subject})


class Issuer:
    """An API server's signing key: tokens, and the key set it serves."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.fetches = 0

    def jwks(self) -> dict[str, Any]:
        self.fetches += 1
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def token(self, audience: str = "ds-sidecar", lifetime: float = 3600, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": [audience], "sub": ACCOUNT, "iat": now,
                   "nbf": now, "exp": now + int(lifetime), "kubernetes.io": {"pod": POD},
                   **claims}  # fmt: skip
        return jwt.encode(payload, self.key, algorithm="RS256", headers={"kid": self.kid})


def verifier(issuer: Issuer, clock: list[float]) -> ServiceAccountKeys:
    return ServiceAccountKeys(
        ServiceAccountKeysSettings(), "ds-sidecar", clock=lambda: clock[0], fetch=issuer.jwks
    )


def test_a_token_of_the_key_set_is_accepted_for_its_audience_only() -> None:
    issuer, clock = Issuer("k1"), [0.0]
    keys = verifier(issuer, clock)
    assert keys.identity(issuer.token()) == Subject(ACCOUNT, "orders-7d9f-abcde")
    refused = {
        "issued for other audiences than ds-sidecar": issuer.token(audience="ds-assigner"),
        "token expired": issuer.token(lifetime=-120),
        "Invalid issuer": issuer.token(iss="https://elsewhere"),
        "lives 31536000 s": issuer.token(lifetime=365 * 86400),  # an extended kubelet token
        "not a service account": issuer.token(sub="alice"),
    }
    for why, token in refused.items():
        with pytest.raises(ReviewRejected, match=why):
            keys.identity(token)
    forged = Issuer("k1").token()  # the same kid, another key
    with pytest.raises(ReviewRejected, match="invalid token"):
        keys.identity(forged)
    assert issuer.fetches == 1


def test_an_unknown_key_id_fetches_the_key_set_again_at_most_once_per_refresh() -> None:
    old, clock = Issuer("k1"), [0.0]
    keys = verifier(old, clock)
    keys.identity(old.token())
    rotated = Issuer("k2")
    keys._fetch = rotated.jwks  # the API server now signs with k2
    with pytest.raises(ReviewRejected, match="unknown key id k2"):
        keys.identity(rotated.token())  # fetched 0 s ago: not again
    clock[0] = 61.0
    assert keys.identity(rotated.token()).name == ACCOUNT
    assert (old.fetches, rotated.fetches) == (1, 1)


def test_auth_takes_one_of_token_review_and_service_account_keys() -> None:
    with pytest.raises(ValueError, match="set one"):
        AuthSettings(token_review={}, service_account_keys={})


def test_an_api_server_ca_that_cannot_be_read_refuses_the_token(tmp_path: Any) -> None:
    """The key set cannot be fetched when the API server's CA file is missing or not a
    certificate (a ConfigMap not projected yet): the token is refused with a reason
    (UNAUTHENTICATED), never an error out of the verifier (INTERNAL)."""
    token = Issuer("k1").token()
    (tmp_path / "token").write_text("api-token")
    (tmp_path / "ca.crt").write_text("not a certificate")
    for ca in (tmp_path / "missing.crt", tmp_path / "ca.crt"):
        settings = ServiceAccountKeysSettings(
            server="https://127.0.0.1:1", ca_file=ca, token_file=tmp_path / "token"
        )
        with pytest.raises(ReviewRejected, match="cannot fetch the key set"):
            ServiceAccountKeys(settings, "ds-sidecar").identity(token)
