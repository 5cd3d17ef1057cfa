"""Chaos scenario 4 (issue 17): the assigner leader stalled (SIGSTOP) for 20 s, then
resumed (SIGCONT), the mesh under load on the 3-broker cluster with two assigner
replicas: a standby leads, every sidecar attaches to it, the stalled leader is fenced and
steps down when it wakes ("lost leadership"), no partition has two live holders at any
sampled moment, and every record is accounted for (tests/support/chaos.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from services.devstack.consul import ConsulHandle
from services.devstack.kafka import KafkaCluster
from tests.support.accounting import report
from tests.support.chaos import SIDECARS, LoadedMesh
from tests.support.mesh import ServiceProcess
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

STALL = 20.0


def test_stalled_assigner_leader_is_replaced_fenced_and_steps_down(
    kafka_cluster3: KafkaCluster, consul_agent: ConsulHandle, tmp_path: Path
) -> None:
    stalled: ServiceProcess | None = None
    try:
        with LoadedMesh(
            kafka_cluster3, tmp_path, "chaos-stall", consul=consul_agent.http_addr, assigners=2
        ) as run:
            leader = run.assigner
            (standby,) = (r for r in run.assigners if r is not leader)
            with run.phase(f"assigner leader SIGSTOP {STALL:.0f}s"):
                leader.signal(signal.SIGSTOP)
                stalled = leader
                stopped_at = time.monotonic()
                wait_for(lambda: run.members(standby) is not None, 30, "standby leads")
                took_over = time.monotonic() - stopped_at
                wait_for(
                    lambda: run.members(standby) == set(SIDECARS),
                    60,
                    "every sidecar attached to the new leader",
                )
                time.sleep(max(0.0, STALL - (time.monotonic() - stopped_at)))
                leader.signal(signal.SIGCONT)
                stalled = None
                wait_for(
                    lambda: "lost leadership" in leader.log.read_text(errors="replace"),
                    30,
                    "the old leader steps down",
                )
            time.sleep(3)
            after = run.leaders()
            accounting = run.finish()
            old_log = leader.log.read_text(errors="replace")
    finally:
        if stalled is not None:
            stalled.signal(signal.SIGCONT)

    lost_line = next(line for line in old_log.splitlines() if "lost leadership" in line)
    report(
        accounting.line(f"assigner leader SIGSTOP {STALL:.0f}s (2 assigner replicas)")
        + f"; standby led {took_over:.2f}s after the stop; leader after "
        f"{[r.log.stem for r in after]}; the old leader on waking: "
        f"{lost_line.split('[warning  ]')[-1].strip()[:160]}"
    )
    assert [r.grpc_addr for r in after] == [standby.grpc_addr]
    accounting.check()
