"""How dsctl reaches the mesh: the runtime's channel defaults with the TLS, mTLS and token
files of the ``DS_TLS__*`` variables (``DS_TLS__CA_FILE``, ``DS_TLS__TOKEN_FILE``, ...), the
same variables and meaning as every service's ``tls`` settings; none set: plaintext."""

from __future__ import annotations

import functools

from dsclient.connection import DEFAULT_SETTINGS, ConnectionSettings, TlsConfig


@functools.cache
def connection() -> ConnectionSettings:
    """Read once per dsctl run; ValueError naming the variable if one is malformed."""
    return DEFAULT_SETTINGS.with_tls(TlsConfig.from_env())


def sidecar_connection() -> ConnectionSettings:
    """The same, to a sidecar: the token of ``DS_TLS__SIDECAR_TOKEN_FILE`` when set (its
    audience ds-sidecar; the control plane's token is refused there)."""
    settings = connection()
    return settings.with_tls(settings.tls.for_sidecars())
