"""``dsctl dev up --secure --with-consul``: Consul's gRPC health checks of the services'
mTLS ports pass, so discovery through Consul (passing instances only) finds every service,
and the assigner takes the leader lock, whose Consul session is bound to its check.

Consul checks a TLS port over TLS (services/runtime/discovery.py); an mTLS port also wants
a client certificate, which the agent presents when it has one (the dev CA's ``consul``
certificate, :func:`services.devstack.consul.check_tls_args`), as the compose stack's does.

Uses the fixed service ports of ARCHITECTURE §9 and Consul's 8500, like
tests/e2e/test_dsctl_dev.py and tests/e2e/test_dev_secure.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from services.devstack import secure
from services.devstack.pki import DevPki
from services.devstack.ports import free_port
from services.runtime.discovery import ConsulDiscovery
from tests.support.dev_stacks import dev_env, dev_state, down_and_gone, dsctl, require_free
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

FIXED_PORTS = (7061, 7070, 7071, 7080, 7081, 7082, 7083, 7090, 7091, 8500)
# What each service registers, by its discovery name: sidecar-0 and the probe's sidecar.
REGISTERED = {
    "ds-assigner": ["127.0.0.1:7070"],
    "ds-notifier": ["127.0.0.1:7090"],
    "ds-sidecar": ["127.0.0.1:7080", "127.0.0.1:7082"],
}


def service_checks(consul: str) -> list[dict[str, Any]]:
    """Every service check the agent runs, with its last output (the catalog's copy of an
    output lags)."""
    with urllib.request.urlopen(f"http://{consul}/v1/agent/checks", timeout=5) as r:
        checks: dict[str, dict[str, Any]] = json.loads(r.read())
    return [c for c in checks.values() if c["ServiceName"]]


def test_consul_checks_pass_and_discovery_finds_every_service(tmp_path: Path) -> None:
    require_free(FIXED_PORTS)
    env = dev_env(tmp_path / "dev", plain=True)
    kafka_port = free_port()
    up = dsctl(
        "dev", "up", "--detach", "--secure", "--with-consul", "--kafka-port", str(kafka_port),
        env=env,
    )  # fmt: skip
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = dev_state(env)
        pids = [c["pid"] for c in state["components"]]
        consul = state["consul"]
        assert consul == "127.0.0.1:8500"
        pki = DevPki(Path(state["pki"]))

        # Every registered service's check turns passing (1 s interval); a check that
        # cannot reach an mTLS port stays critical, with the handshake's error as output.
        deadline = time.monotonic() + 60
        checks = service_checks(consul)
        while time.monotonic() < deadline and (
            len(checks) < 4 or any(c["Status"] != "passing" for c in checks)
        ):
            time.sleep(1)
            checks = service_checks(consul)
        seen = sorted((c["ServiceID"], c["Status"], c["Output"][:200]) for c in checks)
        assert sorted(c["ServiceName"] for c in checks) == [
            "ds-assigner", "ds-notifier", "ds-sidecar", "ds-sidecar",
        ], seen  # fmt: skip
        assert all(c["Status"] == "passing" for c in checks), seen

        # The services' own discovery (passing instances only) finds every one of them. It
        # reads the catalog, which learns a check's status from the agent a moment after
        # the agent's own view above (anti-entropy): in a CI run the assigner's check had
        # just passed on the agent and the catalog did not list it yet. So wait for it.
        discovery = ConsulDiscovery(consul)

        def discovered() -> dict[str, list[str]]:
            return {
                service: sorted(i.endpoint for i in asyncio.run(discovery.healthy(service))[1])
                for service in REGISTERED
            }

        wait_for(
            lambda: discovered() == REGISTERED, 60, "discovery to find every service",
            every=0.5, detail=lambda: f"found {discovered()}, expected {REGISTERED}",
        )  # fmt: skip

        # The assigner's leader session (bound to its check) could be made: it leads, and
        # dsctl, with the stack's client certificate and the admin token, lists group demo.
        tools = {**env, **secure.tls_env(pki, secure.CLIENT_CERTIFICATE, "admin")}
        deadline = time.monotonic() + 60
        groups = dsctl("groups", env=tools)
        while groups.returncode != 0 and time.monotonic() < deadline:
            time.sleep(1)
            groups = dsctl("groups", env=tools)
        assert groups.returncode == 0, groups.stdout + groups.stderr
        assert "demo" in groups.stdout

        # The checks' TLS handshakes leave the services' logs alone: the check names no
        # server (SNI) the service's certificate lacks, such as the Consul node's name
        # (gRPC logs "No match found for server name" at every check otherwise).
        logs = {c["name"]: Path(c["log"]).read_text() for c in state["components"]}
        noisy = {
            name: text.count("No match found for server name")
            for name, text in logs.items()
            if "No match found for server name" in text
        }
        assert noisy == {}, noisy
    finally:
        down_and_gone(env, pids, (*FIXED_PORTS, kafka_port))
