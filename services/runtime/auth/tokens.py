"""Bearer tokens → identities: JWTs verified with PyJWT, or a static token file.

A JWT is verified against the configured key (signature, ``exp``, ``aud``, ``iss`` when
set; 30 s of clock skew allowed) and names its caller in ``sub``. Its ``aud`` must name the
service checking it (``auth.jwt_audience``, by default the service's discovery name:
``ds-assigner``, ``ds-sidecar``, ``ds-notifier``): a token a client sent to a sidecar cannot
be replayed at the assigner or the notifier (issue 37), and the refusal says whose it is.
The key file is one PEM key, or a JSON key set (JWKS) in which each key has a ``kid``: a
token then names the key it was signed with in its header, and every key of the set
verifies the tokens naming it, so keys rotate without a restart (add the new key, sign with
it, drop the old one once its tokens have expired). No token lives longer than
``jwt_max_lifetime_seconds`` from its ``iat`` (issue 37, finding 12): a stolen token is
worth a day at most by default.

The static file maps identities to tokens for set-ups too small for a token issuer; it is
compared by SHA-256 digest, so no comparison leaks a token's prefix through timing. Both
files are re-read when they change (a rotated key or a revoked token takes effect within a second).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from dsclient.watched_file import WatchedFile
from services.runtime.auth.service_account_keys import ServiceAccountKeys
from services.runtime.auth.settings import AuthSettings
from services.runtime.auth.token_review import ReviewRejected, Subject, TokenReviewer

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


def parse_keys(data: bytes) -> bytes | Mapping[str, Any]:
    """The key file: a JSON key set → {kid: PyJWK}; anything else (a PEM key, an HMAC
    secret) as it is. ValueError if a key set is malformed or a key has no kid."""
    if not data.lstrip().startswith(b"{"):
        return data
    import jwt  # as in _jwt_subject: only where JWTs are checked

    try:
        keys = jwt.PyJWKSet.from_json(data.decode()).keys
    except (jwt.PyJWTError, ValueError) as exc:
        raise ValueError(f"the JWT key set is not valid: {exc}") from exc
    if any(not key.key_id for key in keys):
        raise ValueError("every key of the JWT key set needs its kid")
    return {str(key.key_id): key for key in keys}


class TokenVerifier:
    """Checks a bearer token against the JWT key and the static tokens, whichever is set."""

    def __init__(
        self,
        settings: AuthSettings,
        audience: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``audience``: the ``aud`` a token must name (``auth.jwt_audience`` when set wins);
        ``clock``: when the key file is looked at again (at most once a second)."""
        self._settings = settings
        self.audience = settings.jwt_audience or audience
        self._key = (
            WatchedFile(settings.jwt_key_file, parse_keys, clock=clock)
            if settings.jwt_key_file
            else None
        )
        self._static = (
            WatchedFile(settings.tokens_file, parse_static_tokens) if settings.tokens_file else None
        )
        self._review: TokenReviewer | ServiceAccountKeys | None = None
        self._review_name = "TokenReview"
        if settings.token_review:
            self._review = TokenReviewer(settings.token_review, audience=self.audience)
        elif settings.service_account_keys:
            self._review = ServiceAccountKeys(settings.service_account_keys, self.audience)
            self._review_name = "service-account keys"

    def identity(self, token: str) -> str:
        """The identity ``token`` names; TokenRejected if it names none."""
        return self.subject(token).name

    def subject(self, token: str) -> Subject:
        """Who ``token`` names (with its pod, for a pod-bound service-account token);
        TokenRejected if nobody. The project's own tokens are checked first (locally; they
        name no pod); then, with ``token_review``, the API server is asked (a pod's
        projected service-account token), or, with ``service_account_keys``, its key set."""
        if self._review is None:
            return Subject(self._own_identity(token))
        try:
            return Subject(self._own_identity(token))
        except TokenRejected as own:
            try:
                return self._review.identity(token)
            except ReviewRejected as exc:
                raise TokenRejected(f"{own}; {self._review_name}: {exc}") from None

    def _own_identity(self, token: str) -> str:
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
        required = ["exp", "sub"] + (["iat"] if settings.jwt_max_lifetime_seconds else [])
        try:
            claims = jwt.decode(
                token,
                self._key_for(token),
                algorithms=list(settings.jwt_algorithms),
                audience=self.audience,
                issuer=settings.jwt_issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": [*required, "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRejected("token expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRejected(self._wrong_audience(token)) from exc
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"invalid token: {exc}") from exc
        self._check_lifetime(claims)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise TokenRejected("invalid token: empty subject")
        return subject

    def _wrong_audience(self, token: str) -> str:
        """Why a signed token for another service is refused: whose it is, whose it is not."""
        import jwt

        aud = jwt.decode(token, options={"verify_signature": False}).get("aud")
        named = aud if isinstance(aud, list) else [aud]
        return (
            f"wrong audience: the token is for {', '.join(str(a)[:64] for a in named[:4])}, "
            f"this service accepts {self.audience}"
        )

    def _key_for(self, token: str) -> Any:
        """The key that verifies ``token``: the one PEM key, or the key of the set its
        header's ``kid`` names (TokenRejected when it names none of them)."""
        import jwt

        assert self._key is not None
        keys = self._key.get()
        if isinstance(keys, bytes):
            return keys
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise TokenRejected(f"invalid token: {exc}") from exc
        if not isinstance(kid, str) or not kid:
            raise TokenRejected("invalid token: no key id (kid)")
        key = keys.get(kid)
        if key is None:
            raise TokenRejected(f"invalid token: unknown key id {kid[:64]}")
        return key

    def _check_lifetime(self, claims: Mapping[str, Any]) -> None:
        limit = self._settings.jwt_max_lifetime_seconds
        if limit is None:
            return
        lifetime = float(claims["exp"]) - float(claims["iat"])
        if lifetime > limit:
            raise TokenRejected(f"invalid token: lives {lifetime:.0f} s, more than {limit:.0f} s")
