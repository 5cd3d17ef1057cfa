"""services.runtime.http.HttpEndpoint: serves its pages, sleeps while nobody asks (issue 34:
it used to wake every 0.5 s to look at its shutdown flag), and stops when told."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

from services.runtime.http import HttpEndpoint


def _wakeups(tid: int | None) -> int:
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches"))
    return int(line.split()[1])


def test_an_idle_endpoint_sleeps_serves_and_stops() -> None:
    endpoint = HttpEndpoint("127.0.0.1", 0, CollectorRegistry(), lambda: (True, {}))
    endpoint.start()
    try:
        url = f"http://127.0.0.1:{endpoint.port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
        time.sleep(0.2)  # the request's answer is behind the accepting thread
        before = _wakeups(endpoint.thread.native_id)
        time.sleep(1.6)  # serve_forever() would have woken three times
        assert _wakeups(endpoint.thread.native_id) == before
        with urllib.request.urlopen(url, timeout=10) as response:  # still serving
            assert b"SERVING" in response.read()
    finally:
        endpoint.stop()
    assert not endpoint.thread.is_alive()
