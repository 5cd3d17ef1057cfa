"""Chaos scenario 1 (issue 17): broker faults on the 3-broker cluster with the mesh under
load. In one run: kill -9 of the broker leading the most partitions of the topic (then
started again); a rolling restart of all three brokers (each stopped gracefully, started,
and every replica back in sync before the next); kill -9 of the active KRaft controller
(then started again). Throughout: a producer writing (acks=all, idempotent), three
sidecars, two clients acking; at the end every record is accounted for
(tests/support/chaos.py) and the scenario prints one summary line.

Each broker restart takes a minute or more on a loaded 2-core box, so CI runs the two kills
(two restarts) and the ``long`` profile all three faults (five restarts).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from services.devstack.kafka import KafkaCluster
from tests.support.accounting import report
from tests.support.chaos import LoadedMesh

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize(
    "rolling",
    [
        pytest.param(False, id="kills"),
        pytest.param(True, id="kills-and-rolling-restart", marks=pytest.mark.long),
    ],
)
def test_leader_kill_rolling_restart_and_controller_kill_lose_nothing(
    kafka_cluster3: KafkaCluster, tmp_path: Path, rolling: bool
) -> None:
    cluster = kafka_cluster3
    with LoadedMesh(cluster, tmp_path, "chaos-brokers") as run:
        leaders = Counter(cluster.partition_leaders(run.topic).values())
        victim, led = leaders.most_common(1)[0]
        with run.phase(f"leader kill (broker {victim}, leading {led})"):
            cluster.kill_broker(victim)
            run.wait_flowing(200, f"consumption after broker {victim} was killed")
            cluster.start_broker(victim)
            run.wait_replicated()
        if rolling:
            with run.phase("rolling restart"):
                for i in range(3):
                    cluster.stop_broker(i)
                    run.wait_flowing(100, f"consumption with broker {i} stopped")
                    cluster.start_broker(i)
                    run.wait_replicated()
        controller = cluster.active_controller()
        with run.phase(f"controller kill (broker {controller})"):
            cluster.kill_broker(controller)
            run.wait_flowing(200, f"consumption after controller {controller} was killed")
            cluster.start_broker(controller)
            run.wait_replicated()
        accounting = run.finish()
    faults = (
        "leader kill, rolling restart, controller kill"
        if rolling
        else "leader kill, controller kill"
    )
    report(accounting.line(f"broker faults ({faults})"))
    accounting.check()
