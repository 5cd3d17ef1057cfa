"""Workload identity on Kubernetes: a pod's projected service-account token (audience-scoped,
short-lived, rotated by the kubelet) verified by the API server with a TokenReview, so no
long-lived token sits in a Secret for the sidecar or the application.

The identity is the service account's username, ``system:serviceaccount:NAMESPACE:NAME``:
the policy file names it like any other identity, with its roles and group scopes
(``sidecar``, ``serves:GROUP``, ``reader:GROUP``, ...). A token bound to a pod (every token
the kubelet projects; ``kubectl create token --bound-object-kind Pod``) also names its pod:
the API server puts it in the review's ``user.extra`` (``authentication.kubernetes.io/
pod-name``), and the :class:`Subject` keeps it, so the ``sidecar`` role can let an injected
sidecar hold the Session of its own id, the pod's name (:mod:`.policy`). Only service
accounts are accepted (not users), and only tokens the API server says were issued for one
of ``audiences``.
Answers are cached per token (SHA-256 digest) for ``cache_seconds``, so the API server is
asked once a minute per token, not once a call; a refusal is cached too, for less time.
:func:`review_identity` is the rule (pure); :class:`TokenReviewer` does the HTTPS call.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from services.runtime.auth.api_server import ApiServerClient, ApiServerConnection, ApiServerError

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
# What the API server adds to the review of a token bound to a pod (Kubernetes >= 1.21 puts
# both in ``status.user.extra``, each a list of one string).
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
REFUSAL_CACHE_SECONDS = 5.0
MAX_CACHED = 10_000


class TokenReviewSettings(ApiServerConnection):
    """``auth.token_review``: where the API server is (its token_file's service account
    bound to system:auth-delegator) and how this service calls it."""

    audiences: tuple[str, ...] = Field(
        (),
        description="a token must be issued for one of these; empty: the service's own "
        "audience (its discovery name, as for the project's own tokens: ds-assigner, "
        "ds-sidecar, ds-notifier), so a pod token meant for its sidecar cannot be replayed "
        "at the assigner",
    )
    cache_seconds: float = Field(
        60.0, gt=0, le=600, description="how long an accepted token's identity is kept"
    )


@dataclass(frozen=True)
class Subject:
    """Who a token names: the identity (the policy's key) and, for a service-account token
    bound to a pod, that pod (its name, in the service account's namespace; else "")."""

    name: str
    pod: str = ""


class ReviewRejected(Exception):
    """The API server did not vouch for the token (or could not be asked); why."""


def review_identity(status: Mapping[str, Any], audiences: tuple[str, ...]) -> Subject:
    """The identity a TokenReview's ``status`` grants, with the pod its token is bound to
    (if it is); ReviewRejected with the reason."""
    if not status.get("authenticated"):
        raise ReviewRejected(f"not authenticated: {status.get('error') or 'unknown token'}")
    if audiences and not set(status.get("audiences") or ()) & set(audiences):
        raise ReviewRejected(f"issued for other audiences than {', '.join(audiences)}")
    username = str((status.get("user") or {}).get("username") or "")
    namespace_and_name = username.removeprefix(SERVICE_ACCOUNT_PREFIX)
    if not username.startswith(SERVICE_ACCOUNT_PREFIX) or namespace_and_name.count(":") != 1:
        raise ReviewRejected(f"not a service account ({username[:80]!r})")
    return Subject(username, bound_pod((status.get("user") or {}).get("extra")))


def bound_pod(extra: Any) -> str:
    """The name of the pod a reviewed token is bound to: ``extra``'s one pod name, when it
    names one with its uid; "" otherwise (a token bound to no pod, or an answer that is
    not the API server's shape: never a pod by guess)."""
    if not isinstance(extra, Mapping):
        return ""
    names, uids = extra.get(POD_NAME_EXTRA), extra.get(POD_UID_EXTRA)
    if not (isinstance(names, list) and len(names) == 1 and isinstance(names[0], str)):
        return ""
    if not (isinstance(uids, list) and len(uids) == 1 and isinstance(uids[0], str) and uids[0]):
        return ""
    return names[0]


class TokenReviewer:
    """Asks the API server who a token is (TokenReview), with a bounded per-token cache."""

    def __init__(
        self,
        settings: TokenReviewSettings,
        clock: Callable[[], float] = time.monotonic,
        post: Callable[[bytes], Mapping[str, Any]] | None = None,
        audience: str = "",
    ) -> None:
        """``audience``: the service's own, asked for when ``settings.audiences`` is empty."""
        self.settings = settings
        self.audiences = settings.audiences or ((audience,) if audience else ())
        if not self.audiences:
            raise ValueError("a TokenReview needs an audience: the service's or audiences")
        self.clock = clock
        self._post = post or self._https_post
        self._cache: dict[bytes, tuple[float, Subject | None, str]] = {}
        self._lock = threading.Lock()
        self._api_server = ApiServerClient(settings)

    def identity(self, token: str) -> Subject:
        """Who the API server says ``token`` is (cached); ReviewRejected if nobody."""
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
                "spec": {"token": token, "audiences": list(self.audiences)},
            }
        ).encode()
        try:
            answer = self._post(body)
        except ReviewRejected:
            raise  # the API server could not be asked: not cached
        try:
            identity = review_identity(answer.get("status") or {}, self.audiences)
        except ReviewRejected as exc:
            self._remember(digest, now + REFUSAL_CACHE_SECONDS, None, str(exc))
            raise
        self._remember(digest, now + self.settings.cache_seconds, identity, "")
        return identity

    def _remember(self, digest: bytes, until: float, identity: Subject | None, why: str) -> None:
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                now = self.clock()
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[digest] = (until, identity, why)

    def _https_post(self, body: bytes) -> Mapping[str, Any]:
        try:
            return self._api_server.call(
                REVIEW_PATH, body, what="TokenReview", doing="review tokens"
            )
        except ApiServerError as exc:
            raise ReviewRejected(str(exc)) from None
