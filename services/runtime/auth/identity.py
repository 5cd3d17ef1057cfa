"""Who is calling: from the bearer token or the client certificate of a call.

:class:`Authenticator` turns what a call carries into an :class:`Identity` (or refuses it
with ``UNAUTHENTICATED``); the authorization interceptor sets :data:`CURRENT` for the
servicer's task, so a servicer that needs the caller (the assigner's Session, which binds a
sidecar id to the identity holding it) reads :func:`current_identity` instead of parsing
credentials itself.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from dsclient.reasons import DsError, Reason
from services.runtime.auth.settings import AuthSettings
from services.runtime.auth.tokens import TokenRejected, TokenVerifier

Source = Literal["token", "certificate"]
BEARER = "bearer "


@dataclass(frozen=True)
class Identity:
    """An authenticated caller: its name (policy key), how it proved it and, for a
    service-account token bound to a pod (TokenReview), that pod's name (else "")."""

    name: str
    source: Source
    pod: str = ""

    def __str__(self) -> str:
        return self.name


# The identity of the call the current task serves; None when authorization is off.
CURRENT: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "ds_identity", default=None
)


def current_identity() -> Identity | None:
    """The caller of the call being served; None when authorization is off."""
    return CURRENT.get()


def unauthenticated(why: str) -> DsError:
    return DsError(Reason.UNAUTHENTICATED, f"unauthenticated: {why}", metadata={"why": why})


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of an ``authorization: Bearer ...`` header; None if there is none."""
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else value
        if text[: len(BEARER)].lower() == BEARER:
            return text[len(BEARER) :].strip() or None
    return None


def certificate_name(auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
    """The verified client certificate's subject common name; None without one."""
    for name in auth_context.get("x509_common_name") or ():
        return name.decode()
    return None


class Authenticator:
    """Token or certificate → :class:`Identity`, as ``auth.identity_from`` says."""

    def __init__(self, settings: AuthSettings, audience: str) -> None:
        """``audience``: the service's own (its discovery name), the ``aud`` its tokens name."""
        self._from = settings.identity_from
        self._tokens = (
            TokenVerifier(settings, audience) if settings.identity_from != "certificate" else None
        )

    def authenticate(self, token: str | None, certificate: str | None) -> Identity:
        """The caller; DsError UNAUTHENTICATED (metadata ``why``) if it cannot be told."""
        if token is not None and self._tokens is not None:
            try:
                subject = self._tokens.subject(token)
                return Identity(subject.name, "token", pod=subject.pod)
            except TokenRejected as exc:
                raise unauthenticated(str(exc)) from None
        if self._from == "token":
            raise unauthenticated("no bearer token (metadata authorization: Bearer TOKEN)")
        if certificate is not None:
            return Identity(certificate, "certificate")
        if self._from == "certificate":
            raise unauthenticated("no client certificate")
        raise unauthenticated("no bearer token and no client certificate")
