"""How a service authenticates and authorizes its callers (``auth:`` / ``DS_AUTH__*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.runtime.auth.service_account_keys import ServiceAccountKeysSettings
from services.runtime.auth.token_review import TokenReviewSettings

IdentityFrom = Literal["token", "certificate", "token_or_certificate"]


class AuthSettings(BaseModel):
    """Off by default: every caller may do everything, as on loopback with ``make run``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(False, description="authenticate every call and apply the policy")
    policy_file: Path | None = Field(
        None, description="YAML: identities → roles (re-read on change)"
    )
    identity_from: IdentityFrom = Field(
        "token_or_certificate",
        description="who a caller is: its bearer token's subject, its client certificate's "
        "common name (needs tls.client_auth=require), or the token when it sends one, else "
        "the certificate",
    )
    jwt_key_file: Path | None = Field(
        None,
        description="the keys tokens are verified against: a PEM public key (or HMAC "
        'secret), or a JSON key set (JWKS, {"keys": [...]}, each with its kid) whose every '
        "key verifies the tokens naming its kid: add the new key, sign with it, drop the old",
    )
    jwt_max_lifetime_seconds: float | None = Field(
        86400,
        gt=0,
        description="a token whose exp is further than this past its iat (or that has no "
        "iat) is refused, whatever its signature; None = no maximum",
    )
    # The JWT signature algorithms accepted (a token signed otherwise is refused).
    jwt_algorithms: tuple[str, ...] = Field(("ES256", "RS256", "EdDSA"))
    jwt_audience: str | None = Field(
        None,
        description="the `aud` a token must name to be accepted here; None: this service's "
        "own audience, its discovery name (ds-assigner, ds-sidecar, ds-notifier), so a token "
        "minted for one service is refused by the others",
    )
    jwt_issuer: str | None = Field(None, description="required `iss` claim, if set")
    tokens_file: Path | None = Field(
        None, description="static tokens for small set-ups, YAML `tokens: {IDENTITY: TOKEN}`"
    )
    token_review: TokenReviewSettings | None = Field(
        None,
        description="on Kubernetes: also accept pods' projected service-account tokens, "
        "verified by the API server (TokenReview); the identity is "
        "system:serviceaccount:NAMESPACE:NAME; its token_file's service account needs the "
        "system:auth-delegator binding",
    )
    service_account_keys: ServiceAccountKeysSettings | None = Field(
        None,
        description="on Kubernetes, instead of token_review: pods' projected service-account "
        "tokens verified locally against the API server's OIDC key set (no RBAC needed, no "
        "revocation before exp)",
    )

    @model_validator(mode="after")
    def _complete(self) -> AuthSettings:
        if self.token_review and self.service_account_keys:
            raise ValueError("auth.token_review and auth.service_account_keys: set one")
        if not self.enabled:
            return self
        if self.policy_file is None:
            raise ValueError("auth.enabled needs auth.policy_file")
        if self.identity_from != "certificate" and not (
            self.jwt_key_file or self.tokens_file or self.token_review or self.service_account_keys
        ):
            raise ValueError(
                f"auth.identity_from={self.identity_from} needs auth.jwt_key_file, "
                "auth.tokens_file, auth.token_review or auth.service_account_keys"
            )
        return self
