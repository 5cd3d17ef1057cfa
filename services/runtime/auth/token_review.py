"""Workload identity on Kubernetes: a pod's projected service-account token (audience-scoped,
short-lived, rotated by the kubelet) verified by the API server with a TokenReview, so no
long-lived token sits in a Secret for the sidecar or the application.

The identity is the service account's username, ``system:serviceaccount:NAMESPACE:NAME``:
the policy file names it like any other identity, with its roles and group scopes
(``sidecar``, ``serves:GROUP``, ``reader:GROUP``, ...). Only service accounts are accepted
(not users), and only tokens the API server says were issued for one of ``audiences``.
Answers are cached per token (SHA-256 digest) for ``cache_seconds``, so the API server is
asked once a minute per token, not once a call; a refusal is cached too, for less time.
:func:`review_identity` is the rule (pure); :class:`TokenReviewer` does the HTTPS call.
"""

from __future__ import annotations

import hashlib
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

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
REFUSAL_CACHE_SECONDS = 5.0
MAX_CACHED = 10_000


class TokenReviewSettings(BaseModel):
    """``auth.token_review``: where the API server is and how this service calls it."""

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
        description="the token this service reviews with (its service account's, bound to "
        "system:auth-delegator); re-read at each review",
    )
    audiences: tuple[str, ...] = Field(
        ("dataservice",), description="a token must be issued for one of these"
    )
    cache_seconds: float = Field(
        60.0, gt=0, le=600, description="how long an accepted token's identity is kept"
    )
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="per TokenReview call")


class ReviewRejected(Exception):
    """The API server did not vouch for the token (or could not be asked); why."""


def review_identity(status: Mapping[str, Any], audiences: tuple[str, ...]) -> str:
    """The identity a TokenReview's ``status`` grants; ReviewRejected with the reason."""
    if not status.get("authenticated"):
        raise ReviewRejected(f"not authenticated: {status.get('error') or 'unknown token'}")
    if audiences and not set(status.get("audiences") or ()) & set(audiences):
        raise ReviewRejected(f"issued for other audiences than {', '.join(audiences)}")
    username = str((status.get("user") or {}).get("username") or "")
    namespace_and_name = username.removeprefix(SERVICE_ACCOUNT_PREFIX)
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or namespace_and_name.count(":") != 1:
        raise ReviewRejected(f"not a service account ({username[:80]!r})")
    return username


class TokenReviewer:
    """Asks the API server who a token is (TokenReview), with a bounded per-token cache."""

    def __init__(
        self,
        settings: TokenReviewSettings,
        clock: Callable[[], float] = time.monotonic,
        post: Callable[[bytes], Mapping[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._post = post or self._https_post
        self._cache: dict[bytes, tuple[float, str | None, str]] = {}
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def identity(self, token: str) -> str:
        digest = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            _, identity, why = cached
            if identity is None:
                raise ReviewRejected(why)
            return identity
        body = json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": list(self.settings.audiences)},
            }
        ).encode()
        try:
            answer = self._post(body)
        except ReviewRejected:
            raise  # the API server could not be asked: not cached
        try:
            identity = review_identity(answer.get("status") or {}, self.settings.audiences)
        except ReviewRejected as exc:
            self._remember(digest, now + REFUSAL_CACHE_SECONDS, None, str(exc))
            raise
        self._remember(digest, now + self.settings.cache_seconds, identity, "")
        return identity

    def _remember(self, digest: bytes, until: float, identity: str | None, why: str) -> None:
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                now = self.clock()
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[digest] = (until, identity, why)

    def _https_post(self, body: bytes) -> Mapping[str, Any]:
        settings = self.settings
        if self._context is None:
            ca = str(settings.ca_file) if settings.ca_file else None
            self._context = ssl.create_default_context(cafile=ca)
        try:
            credential = settings.token_file.read_text().strip()
        except OSError as exc:
            raise ReviewRejected(f"cannot review tokens: {exc.strerror}") from None
        request = urllib.request.Request(
            settings.server.rstrip("/") + REVIEW_PATH,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {credential}",
            },
        )
        try:
            with urllib.request.urlopen(
                request, context=self._context, timeout=settings.timeout_seconds
            ) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ReviewRejected(f"the API server answered TokenReview with {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise ReviewRejected(f"the API server could not be asked: {exc}") from None
        return data if isinstance(data, dict) else {}
