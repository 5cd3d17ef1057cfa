"""The image's health check: ``GET /healthz`` of the service this container runs.

The service is PID 1 (the entry point execs it), so its command line tells which service
runs and whether ``--http-port`` / ``--host`` were given as flags; otherwise ``DS_HTTP_PORT``
/ ``DS_HOST`` or the service's default port (ARCHITECTURE §9) apply. ``DS_HEALTHCHECK_URL``
overrides all of that. A container running ``dsctl`` has nothing to probe and is healthy.

TLS: the service's own environment (``/proc/1/environ``: what it started with, after the
entry point dropped ``DS_TLS__*`` for ``DS_PLAINTEXT=1``) says whether its HTTP port serves
TLS (``DS_TLS__CERT_FILE``); then the probe is HTTPS, verifying the server against
``DS_TLS__CA_FILE`` and presenting the service's own certificate (its port may require one:
mTLS). ``/healthz`` needs no token.
Exit 0 when the endpoint answers 200 (SERVING), 1 otherwise: what HEALTHCHECK expects.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

DEFAULT_HTTP_PORTS = {
    "ds-assigner": 7071,
    "ds-sidecar": 7081,
    "ds-notifier": 7091,
    "ds-demo-app": 7082,
}
ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def flag(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv``, else None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def healthz_url(argv: Sequence[str], env: dict[str, str]) -> str | None:
    """The URL to probe for the service whose command line is ``argv``, None if none."""
    if env.get("DS_HEALTHCHECK_URL"):
        return env["DS_HEALTHCHECK_URL"]
    service = next((s for s in DEFAULT_HTTP_PORTS if any(a.endswith(s) for a in argv)), None)
    if service is None:
        return None
    port = flag(argv, "--http-port") or env.get("DS_HTTP_PORT") or DEFAULT_HTTP_PORTS[service]
    host = flag(argv, "--host") or env.get("DS_HOST", "")
    if host in ANY_ADDRESS:
        host = "127.0.0.1"
    scheme = "https" if env.get("DS_TLS__CERT_FILE") else "http"
    return f"{scheme}://{host}:{port}/healthz"


def tls_context(env: dict[str, str]) -> ssl.SSLContext | None:
    """HTTPS with the service's CA and its own certificate; None: plaintext."""
    if not env.get("DS_TLS__CERT_FILE"):
        return None
    context = ssl.create_default_context(cafile=env.get("DS_TLS__CA_FILE") or None)
    context.load_cert_chain(env["DS_TLS__CERT_FILE"], env.get("DS_TLS__KEY_FILE") or None)
    return context


def service_env() -> dict[str, str]:
    """PID 1's environment (the service's), else this process's."""
    try:
        raw = Path("/proc/1/environ").read_bytes().decode()
    except OSError:
        return dict(os.environ)
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def main() -> int:
    argv = Path("/proc/1/cmdline").read_bytes().decode().split("\0")
    env = service_env()
    url = healthz_url(argv, env)
    if url is None:
        return 0
    try:
        context = tls_context(env) if url.startswith("https:") else None
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
