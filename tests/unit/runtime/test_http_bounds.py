"""The HTTP ports (/metrics, /healthz, /ui) bound what a caller can hold before it is known
(issue 37, finding 11): a connection that sends nothing is closed after the socket
timeout, and connections beyond the bound are closed at once instead of each taking a
thread. Threads stay bounded whatever the number of idle sockets; once they are gone, the
port serves again.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry

from services.runtime.http import HttpEndpoint

IDLE = 40


def test_idle_sockets_cost_a_bounded_number_of_threads_and_time_out() -> None:
    endpoint = HttpEndpoint(
        "127.0.0.1",
        0,
        CollectorRegistry(),
        lambda: (True, {}),
        socket_timeout=0.5,
        max_connections=4,
    )
    endpoint.start()
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(IDLE)]
    try:
        time.sleep(0.2)  # every connection accepted (or refused) by now
        threads = threading.active_count() - before
        print(f"{IDLE} idle sockets: {threads} more threads")
        assert threads <= 4
        closed = 0
        for s in idle:
            s.settimeout(10)
            if s.recv(1) == b"":  # the server closed it: refused, or timed out idle
                closed += 1
        print(f"closed by the server: {closed} of {IDLE}")
        assert closed == IDLE
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        for s in idle:
            s.close()
        endpoint.stop()
