"""Transport security settings: one frozen value for servers and clients alike.

:class:`TlsConfig` names files, never their contents, so that every process reads them
through :class:`~dsclient.watched_file.WatchedFile` and picks up a renewed
certificate, key or token without a restart. The same value is

* a field of every service's settings (``tls``: ``DS_TLS__CERT_FILE=...``, or ``tls:`` in
  the YAML file), validated by pydantic there, giving the service's servers their
  certificate and the service's own client channels (the sidecar's session, the fault
  reporter, the notifier's probe) their CA, client certificate and token;
* what the client library, dsctl and the Spark source read from the same ``DS_TLS__*``
  variables with :meth:`TlsConfig.from_env` (no pydantic: Spark workers import this).

A value with no file set is plaintext, the embedded default on loopback (ARCHITECTURE §8).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ENV_PREFIX = "DS_TLS__"
ClientAuth = Literal["none", "require"]


@dataclass(frozen=True)
class TlsConfig:
    """TLS and token files of one process. Empty: plaintext, no token."""

    # The CA bundle: clients verify servers against it, servers verify client certificates.
    ca_file: Path | None = None
    # This process's certificate chain and key: a server presents them; a client presents
    # them for mTLS when the server asks.
    cert_file: Path | None = None
    # The private key of cert_file.
    key_file: Path | None = None
    # Servers: "require" a client certificate signed by ca_file (mTLS), or "none".
    client_auth: ClientAuth = "none"
    # Clients: a file holding the bearer token every call carries (re-read on change).
    token_file: Path | None = None
    # Clients: the token sent to sidecars instead (its audience ds-sidecar, so a sidecar
    # cannot replay it at the assigner or the notifier); None: token_file.
    sidecar_token_file: Path | None = None
    # Clients: the token sent to the notifier instead (fault reports; its audience
    # ds-notifier, as a pod's projected token for it); None: token_file.
    notifier_token_file: Path | None = None
    # Clients: the name to check the server's certificate against, when it is not the
    # host of the address dialled (an IP address the certificate does not list).
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.client_auth not in ("none", "require"):
            raise ValueError("client_auth must be none or require")
        if self.client_auth == "require" and (self.ca_file is None or self.cert_file is None):
            raise ValueError("client_auth=require needs ca_file, cert_file and key_file")

    def for_sidecars(self) -> TlsConfig:
        """The settings of a channel to a sidecar: its token is ``sidecar_token_file``
        when one is set."""
        if self.sidecar_token_file is None:
            return self
        return dataclasses.replace(self, token_file=self.sidecar_token_file)

    def for_notifier(self) -> TlsConfig:
        """The settings of a channel to the notifier: its token is ``notifier_token_file``
        when one is set."""
        if self.notifier_token_file is None:
            return self
        return dataclasses.replace(self, token_file=self.notifier_token_file)

    @property
    def server_enabled(self) -> bool:
        """Whether this process's servers speak TLS (it has a certificate)."""
        return self.cert_file is not None

    @property
    def client_enabled(self) -> bool:
        """Whether this process's client channels speak TLS (it trusts a CA)."""
        return self.ca_file is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsConfig:
        """The ``DS_TLS__<FIELD>`` variables (any case of FIELD), as the services read them;
        ValueError naming the variable for a bad value."""
        env = os.environ if environ is None else environ
        upper = {k.upper(): v for k, v in env.items() if k.upper().startswith(ENV_PREFIX)}
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = upper.get(ENV_PREFIX + field.name.upper(), "").strip()
            if not raw:
                continue
            if field.name.endswith("_file"):
                values[field.name] = Path(raw)
            else:
                values[field.name] = raw
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"{ENV_PREFIX}*: {exc}") from exc


PLAINTEXT = TlsConfig()
