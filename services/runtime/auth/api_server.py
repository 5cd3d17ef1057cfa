"""The Kubernetes API server as the auth checks reach it: one connection model, one client.

:class:`ApiServerConnection` is where the API server is and what this service calls it
with. ``auth.token_review`` and ``auth.service_account_keys`` inherit it rather than nest it,
so their keys stay flat (``DS_AUTH__TOKEN_REVIEW__SERVER``, ``DS_AUTH__SERVICE_ACCOUNT_KEYS__
CA_FILE``, ...). :class:`ApiServerClient` makes the HTTPS calls: the TLS context made at the
first call, the bearer token re-read at each (the kubelet rotates a projected token).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiServerConnection(BaseModel):
    """Where the Kubernetes API server is and how this service calls it (in a pod, the
    defaults: the in-cluster address, CA and the pod's own service-account token)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    server: str = Field(
        "https://kubernetes.default.svc", description="the Kubernetes API server's URL"
    )
    ca_file: Path | None = Field(
        SERVICE_ACCOUNT_DIR / "ca.crt",
        description="the API server's CA (PEM); None = the system's trust store",
    )
    token_file: Path = Field(
        SERVICE_ACCOUNT_DIR / "token",
        description="the token this service calls the API server with (its own service "
        "account's); re-read at each call",
    )
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="per call to the API server")


class ApiServerError(Exception):
    """The API server could not be asked, or answered with an HTTP error; why."""


class ApiServerClient:
    """JSON over HTTPS to the API server named by an :class:`ApiServerConnection`."""

    def __init__(self, connection: ApiServerConnection) -> None:
        self.connection = connection
        self._context: ssl.SSLContext | None = None

    def call(
        self, path: str, body: bytes | None = None, *, what: str, doing: str
    ) -> Mapping[str, Any]:
        """The JSON object the API server answers at ``path`` (a GET, or a POST of the JSON
        ``body``); an answer that is not an object is {}. ApiServerError otherwise, told in
        terms of ``what`` is asked ("TokenReview") and what the caller is ``doing`` ("review
        tokens")."""
        connection = self.connection
        if self._context is None:
            ca = str(connection.ca_file) if connection.ca_file else None
            try:
                self._context = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:  # missing, unreadable, not a certificate
                raise ApiServerError(f"cannot {doing}: the API server's CA {ca}: {exc}") from None
        try:
            credential = connection.token_file.read_text().strip()
        except OSError as exc:
            raise ApiServerError(f"cannot {doing}: {exc.strerror}") from None
        headers = {"Authorization": f"Bearer {credential}"}
        if body is not None:
            headers = {"Content-Type": "application/json", **headers}
        request = urllib.request.Request(
            connection.server.rstrip("/") + path,
            data=body,
            method="GET" if body is None else "POST",
            headers=headers,
        )
        try:
            with urllib.request.urlopen(
                request, context=self._context, timeout=connection.timeout_seconds
            ) as response:
                data = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ApiServerError(f"the API server answered {what} with {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise ApiServerError(f"the API server could not be asked: {exc}") from None
        return data if isinstance(data, dict) else {}
