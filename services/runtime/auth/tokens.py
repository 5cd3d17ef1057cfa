"""Bearer tokens → identities: JWTs verified with PyJWT, or a static token file.

A JWT is verified against the configured key (signature, ``exp``, ``aud``, ``iss`` when
set; 30 s of clock skew allowed) and names its caller in ``sub``. The static file maps
identities to tokens for set-ups too small for a token issuer; it is compared by SHA-256
digest, so no comparison leaks a token's prefix through timing. Both files are re-read
when they change (a rotated key or a revoked token takes effect within a second).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import yaml

from dsclient.watched_file import WatchedFile
from services.runtime.auth.settings import AuthSettings

LEEWAY_SECONDS = 30


class TokenRejected(Exception):
    """The token is not valid; the message says why (never the token)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_static_tokens(data: bytes) -> Mapping[bytes, str]:
    """``tokens: {IDENTITY: TOKEN}`` → {sha256(TOKEN): IDENTITY}; ValueError if malformed."""
    loaded: Any = yaml.safe_load(data) or {}
    tokens = loaded.get("tokens") if isinstance(loaded, dict) else None
    if not isinstance(tokens, dict):
        raise ValueError("the tokens file must hold `tokens: {IDENTITY: TOKEN}`")
    out: dict[bytes, str] = {}
    for identity, token in tokens.items():
        if not isinstance(token, str) or len(token) < 16:
            raise ValueError(f"tokens.{identity}: a token is a string of at least 16 characters")
        out[_digest(token)] = str(identity)
    return out


class TokenVerifier:
    """Checks a bearer token against the JWT key and the static tokens, whichever is set."""

    def __init__(self, settings: AuthSettings) -> None:
        self._settings = settings
        self._key = WatchedFile(settings.jwt_key_file, bytes) if settings.jwt_key_file else None
        self._static = (
            WatchedFile(settings.tokens_file, parse_static_tokens) if settings.tokens_file else None
        )

    def identity(self, token: str) -> str:
        """The identity ``token`` names; TokenRejected if it names none."""
        if self._static is not None:
            identity = self._static.get().get(_digest(token))
            if identity is not None:
                return identity
        if self._key is None:
            raise TokenRejected("unknown token")
        if token.count(".") != 2:
            raise TokenRejected("unknown token" if self._static else "malformed token")
        return self._jwt_subject(token)

    def _jwt_subject(self, token: str) -> str:
        # PyJWT (and cryptography under it, ~9 MiB) only once a JWT is checked: every
        # service imports this module with its settings, most never see one (issue 34).
        import jwt

        assert self._key is not None
        settings = self._settings
        try:
            claims = jwt.decode(
                token,
                self._key.get(),
                algorithms=list(settings.jwt_algorithms),
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                leeway=LEEWAY_SECONDS,
                options={
                    "require": ["exp", "sub"],
                    "verify_aud": settings.jwt_audience is not None,
                },
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRejected("token expired") from exc
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"invalid token: {exc}") from exc
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise TokenRejected("invalid token: empty subject")
        return subject
