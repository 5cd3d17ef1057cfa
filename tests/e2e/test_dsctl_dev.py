"""The README's run path: ``dsctl dev up --detach`` → status → read data → ``dsctl dev down``.

Uses the fixed service ports of ARCHITECTURE §9 (7070, 7080, 7090, …) and a free Kafka
port, in a private state directory; nothing may be left running afterwards.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from dsclient import DsClient
from services.devstack.ports import free_port
from tests.support.dev_stacks import dev_env, dev_state, down_and_gone, dsctl, require_free

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(400)]

FIXED_PORTS = (7061, 7070, 7071, 7080, 7081, 7082, 7083, 7090, 7091, 7102, 7103)


def test_dev_up_status_down(tmp_path: Path) -> None:
    require_free(FIXED_PORTS)
    env = dev_env(tmp_path / "dev", columns=200)
    kafka_port = free_port()
    up = dsctl("dev", "up", "--detach", "--sidecars", "2", "--kafka-port", str(kafka_port), env=env)
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "grpcurl -plaintext 127.0.0.1:7070 list" in up.stdout
        state = dev_state(env)
        pids = [c["pid"] for c in state["components"]]
        names = {c["name"] for c in state["components"]}
        assert names == {
            "kafka-0",
            "assigner",
            "notifier",
            "sidecar-0",
            "sidecar-1",
            "sidecar-probe",
            "producer",
        }
        assert all(c["running"] for c in state["components"])
        assert all(c["healthy"] in (True, None) for c in state["components"])
        assert state["bootstrap"] == f"127.0.0.1:{kafka_port}"

        # The sample producer feeds ds.demo; the demo group serves it through both sidecars.
        with DsClient("demo", client_id="dev-test", assigner="127.0.0.1:7070") as client:
            deadline = time.monotonic() + 60
            while len(client.endpoints) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sorted(client.endpoints) == ["127.0.0.1:7080", "127.0.0.1:7102"]
            got = []
            while len(got) < 20 and time.monotonic() < deadline:
                batch = client.fetch(max_records=50, max_wait=1.0)
                got += batch
                client.ack(batch)
            assert len(got) >= 20
            assert all(json.loads(r.value)["user"].startswith("user-") for r in got)

        # The broker runs the JMX exporter: its kafka_* metrics (the `kafka` job of
        # deploy/prometheus/prometheus-static.yml) on 7061.
        with urllib.request.urlopen("http://127.0.0.1:7061/metrics", timeout=5) as r:
            broker = dict(
                line.rsplit(" ", 1) for line in r.read().decode().splitlines() if line[:1] != "#"
            )
        assert float(broker["kafka_controller_active_controller_count"]) == 1
        assert float(broker["kafka_server_partition_count"]) >= 12  # ds.demo's 12 at least

        # The end-to-end probe round-trips through its own sidecar (notifier /metrics).
        def probe_received() -> float:
            with urllib.request.urlopen("http://127.0.0.1:7091/metrics", timeout=5) as r:
                text = r.read().decode()
            for line in text.splitlines():
                if line.startswith("ds_probe_received_total "):
                    return float(line.split()[1])
            return 0.0

        deadline = time.monotonic() + 90
        while probe_received() == 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert probe_received() > 0
    finally:
        down_and_gone(env, pids, (*FIXED_PORTS, kafka_port))
    after = dsctl("dev", "status", env=env)
    assert after.returncode == 1 and "no dev stack is running" in after.stderr
