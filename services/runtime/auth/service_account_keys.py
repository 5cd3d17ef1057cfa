"""Workload identity without a TokenReview: a pod's projected service-account token verified
locally against the API server's OIDC key set (``/openid/v1/jwks``).

Meant for a sidecar checking its callers' ``ds-sidecar`` tokens: reviewing them with a
TokenReview would need every workload's service account bound to system:auth-delegator
(an oracle for any token it gets hold of), whereas the key set is readable by every
service account (Kubernetes' ``system:service-account-issuer-discovery`` binding to
``system:serviceaccounts``), so no new RBAC. The token carries all that is needed:
``iss``, ``aud``, ``exp``, ``sub`` (``system:serviceaccount:NAMESPACE:NAME``) and, for a
token bound to a pod, ``kubernetes.io.pod`` (name and uid). The price: no revocation, a
deleted pod's or account's token is accepted until its ``exp`` (the injector asks for an
hour), where a TokenReview refuses it within seconds.

:func:`claims_subject` is the rule (pure); :class:`ServiceAccountKeys` fetches the key set
(again on an unknown ``kid``, at most once per ``refresh_seconds``) and verifies.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.runtime.auth.token_review import SERVICE_ACCOUNT_PREFIX, ReviewRejected, Subject

JWKS_PATH = "/openid/v1/jwks"
LEEWAY_SECONDS = 30


class ServiceAccountKeysSettings(BaseModel):
    """``auth.service_account_keys``: where the API server's key set is, what to accept."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str = Field(
        "https://kubernetes.default.svc", description="the Kubernetes API server's URL"
    )
    ca_file: Path | None = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        description="the API server's CA (PEM); None = the system's trust store",
    )
    token_file: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="the token the key set is fetched with (the pod's own; every service "
        "account may read it)",
    )
    issuer: str = Field(
        "https://kubernetes.default.svc",
        description="the `iss` a token must name (the API server's --service-account-issuer)",
    )
    audiences: tuple[str, ...] = Field(
        (), description="a token must be issued for one of these; empty: the service's own"
    )
    max_lifetime_seconds: float = Field(
        86400,
        gt=0,
        description="a token living longer (exp - iat) is refused: a projected token the "
        "API server extended to a year is not taken",
    )
    refresh_seconds: float = Field(
        60, gt=0, le=3600, description="the least time between two fetches of the key set"
    )
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="per key-set fetch")


def claims_subject(claims: Mapping[str, Any]) -> Subject:
    """The identity a verified service-account token's claims name, with its pod when it
    is bound to one (name and uid both given); ReviewRejected otherwise."""
    subject = str(claims.get("sub") or "")
    namespace_and_name = subject.removeprefix(SERVICE_ACCOUNT_PREFIX)
    if not subject.startswith(SERVICE_ACCOUNT_PREFIX) or namespace_and_name.count(":") != 1:
        raise ReviewRejected(f"not a service account ({subject[:80]!r})")
    kubernetes = claims.get("kubernetes.io")
    pod = kubernetes.get("pod") if isinstance(kubernetes, Mapping) else None
    if isinstance(pod, Mapping):
        name, uid = pod.get("name"), pod.get("uid")
        if isinstance(name, str) and name and isinstance(uid, str) and uid:
            return Subject(subject, name)
    return Subject(subject)


class ServiceAccountKeys:
    """Verifies service-account tokens against the API server's key set (fetched, cached)."""

    def __init__(
        self,
        settings: ServiceAccountKeysSettings,
        audience: str = "",
        clock: Callable[[], float] = time.monotonic,
        fetch: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.audiences = settings.audiences or ((audience,) if audience else ())
        if not self.audiences:
            raise ValueError("service-account keys need an audience: the service's or audiences")
        self.clock = clock
        self._fetch = fetch or self._https_get
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def identity(self, token: str) -> Subject:
        """Who ``token`` is, its signature checked against the key set; ReviewRejected."""
        import jwt

        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise ReviewRejected(f"invalid token: {exc}") from None
        if not isinstance(kid, str) or not kid:
            raise ReviewRejected("invalid token: no key id (kid)")
        key = self._key(kid)
        settings = self.settings
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["RS256", "ES256"],
                audience=list(self.audiences),
                issuer=settings.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iat", "sub", "aud", "iss"]},
            )
        except jwt.ExpiredSignatureError:
            raise ReviewRejected("token expired") from None
        except jwt.InvalidAudienceError:
            raise ReviewRejected(
                f"issued for other audiences than {', '.join(self.audiences)}"
            ) from None
        except jwt.PyJWTError as exc:
            raise ReviewRejected(f"invalid token: {exc}") from None
        lifetime = float(claims["exp"]) - float(claims["iat"])
        if lifetime > settings.max_lifetime_seconds:
            raise ReviewRejected(
                f"invalid token: lives {lifetime:.0f} s, more than "
                f"{settings.max_lifetime_seconds:.0f} s"
            )
        return claims_subject(claims)

    def _key(self, kid: str) -> Any:
        """The key ``kid`` names; the key set fetched again when it does not hold it and
        the last fetch is older than ``refresh_seconds``."""
        import jwt

        with self._lock:
            key = self._keys.get(kid)
            if key is not None:
                return key
            now = self.clock()
            recent = (
                self._fetched_at is not None
                and now - self._fetched_at < self.settings.refresh_seconds
            )
            if not recent:
                answer = self._fetch()  # ReviewRejected when the API server cannot be asked
                self._fetched_at = now
                try:
                    keys = jwt.PyJWKSet.from_dict(dict(answer)).keys
                except (jwt.PyJWTError, ValueError) as exc:
                    raise ReviewRejected(f"the API server's key set is not valid: {exc}") from None
                self._keys = {str(k.key_id): k for k in keys if k.key_id}
            key = self._keys.get(kid)
        if key is None:
            raise ReviewRejected(f"invalid token: unknown key id {kid[:64]}")
        return key

    def _https_get(self) -> Mapping[str, Any]:
        settings = self.settings
        if self._context is None:
            ca = str(settings.ca_file) if settings.ca_file else None
            try:
                self._context = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:  # missing, unreadable, not a certificate
                raise ReviewRejected(
                    f"cannot fetch the key set: the API server's CA {ca}: {exc}"
                ) from None
        try:
            credential = settings.token_file.read_text().strip()
        except OSError as exc:
            raise ReviewRejected(f"cannot fetch the key set: {exc.strerror}") from None
        request = urllib.request.Request(
            settings.server.rstrip("/") + JWKS_PATH,
            headers={"Authorization": f"Bearer {credential}"},
        )
        try:
            with urllib.request.urlopen(
                request, context=self._context, timeout=settings.timeout_seconds
            ) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ReviewRejected(f"the API server answered {JWKS_PATH} with {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise ReviewRejected(f"the API server could not be asked: {exc}") from None
        return data if isinstance(data, dict) else {}
