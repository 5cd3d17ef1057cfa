"""Chaos scenario 3 (issue 17, path 4): Consul down with two assigner replicas, the mesh
under load on the 3-broker cluster: consumption does not stop.

The leader leads on while its state writes confirm its term (a write under the state
topic's transactional id, which a newer leader's term would fence), so leases keep being
renewed and records keep flowing; when Consul is back there is one leader and every
sidecar is attached to it. Before fenced state writes, a leader that could not reach
Consul for 5 s resigned while nobody could be elected, and every lease lapsed within a TTL.

A Consul agent of the test's own (the session's agent is shared), paused with SIGSTOP (its
clients' calls hang and time out, as with a network outage), then resumed. Every record is
accounted for (tests/support/chaos.py). CI runs a 20 s outage; the issue's 60 s is ``long``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from services.devstack.consul import ConsulAgent, ConsulOptions
from services.devstack.kafka import KafkaCluster
from tests.support.accounting import report
from tests.support.chaos import SIDECARS, LoadedMesh
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize(
    "outage",
    [pytest.param(20.0, id="20s"), pytest.param(60.0, id="60s", marks=pytest.mark.long)],
)
def test_consul_down_with_two_assigners_consumption_goes_on(
    kafka_cluster3: KafkaCluster, tmp_path: Path, outage: float
) -> None:
    agent = ConsulAgent(ConsulOptions(base_dir=tmp_path / "consul")).start()
    paused = False
    try:
        with LoadedMesh(
            kafka_cluster3, tmp_path, "chaos-consul", consul=agent.http_addr, assigners=2
        ) as run:
            leader = run.assigner
            assert agent.pid is not None
            with run.phase(f"Consul down {outage:.0f}s"):
                os.kill(agent.pid, signal.SIGSTOP)
                paused = True
                stopped_at = time.monotonic()
                # Records keep arriving in every tenth of the outage.
                windows = []
                step = outage / 10
                for _ in range(10):
                    before = len(run.tally.received())
                    time.sleep(step)
                    windows.append(len(run.tally.received()) - before)
                during = run.leaders()
                os.kill(agent.pid, signal.SIGCONT)
                paused = False
                resumed_at = time.monotonic()
            gap, gap_at = run.tally.longest_gap(stopped_at, resumed_at)
            wait_for(lambda: len(run.leaders()) == 1, 60, "one leader after")
            (after,) = run.leaders()
            wait_for(
                lambda: run.members(after) == set(SIDECARS),
                60,
                "every sidecar attached to the leader after the outage",
            )
            accounting = run.finish()
            logs = {s.log.stem: s.log.read_text(errors="replace") for s in run.sidecars}
            leader_log = leader.log.read_text(errors="replace")
    finally:
        if paused and agent.pid is not None:
            os.kill(agent.pid, signal.SIGCONT)
        agent.stop()

    expired = sum(text.count("lease expired locally") for text in logs.values())
    report(
        accounting.line(f"Consul down {outage:.0f}s (2 assigner replicas)")
        + f"; records per tenth of the outage {windows}; longest gap during it {gap:.2f}s at "
        f"+{gap_at - stopped_at:.1f}s; leases expired locally {expired}; leader during the "
        f"outage {[r.log.stem for r in during]}, after {after.log.stem}"
    )
    assert [r.grpc_addr for r in during] == [leader.grpc_addr], "the leader led on"
    assert "Consul unreachable: leading on" in leader_log
    assert all(n > 0 for n in windows), f"consumption stopped during the outage: {windows}"
    assert expired == 0, "no lease lapsed: the leader kept renewing them"
    accounting.check()
    assert accounting.duplicates == 0
