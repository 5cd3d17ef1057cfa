"""``page_size`` and ``page_token`` (AIP-158) for ListGroups (pure).

Documented limit: page tokens are signed with a per-process key, so a token issued before
a restart is refused (INVALID_ARGUMENT) and the client starts again from the first page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Sequence

from dsclient.reasons import invalid

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


class PageTokens:
    """Opaque page tokens naming the last group of the previous page, HMAC-signed so that
    only tokens this process issued are accepted."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def issue(self, after: str) -> str:
        body = after.encode()
        mac = hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(mac + body).decode().rstrip("=")

    def parse(self, token: str) -> str:
        """The name after which the page starts; "" for the first page."""
        if not token:
            return ""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError) as exc:
            raise invalid("page_token", "not a token this service issued") from exc
        mac, body = raw[:16], raw[16:]
        if len(mac) < 16 or not hmac.compare_digest(
            mac, hmac.new(self._key, body, hashlib.sha256).digest()[:16]
        ):
            raise invalid(
                "page_token", "not a token this service issued (or issued before a restart)"
            )
        return body.decode()


def page_size(requested: int) -> int:
    if requested < 0:
        raise invalid("page_size", "must be >= 0 (0 = server default)")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def page(names: Sequence[str], after: str, size: int) -> tuple[list[str], str]:
    """The names of one page (``names`` sorted) and the last name if more follow, else ""."""
    start = next((i for i, n in enumerate(names) if n > after), len(names)) if after else 0
    chosen = list(names[start : start + size])
    more = start + size < len(names)
    return chosen, (chosen[-1] if more and chosen else "")
