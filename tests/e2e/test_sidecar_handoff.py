"""The injected sidecar's preStop hook, ``dsctl handoff``, on the real mesh: while an
application (configured from the environment an injected pod has: ``DsClient.from_env``)
reads a steady flow, the hook hands every partition of one sidecar to the other through the
assigner, returns once the sidecar holds none — the sidecar still running — and the SIGTERM
that follows stops it at once. Every record arrives, none twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsclient import DsClient
from services.dsctl.handoff import status
from tests.support.mesh import REPO, Mesh
from tests.support.records import (
    ConsumerLoop,
    SeqProducer,
    Tally,
    describe_missing,
    wait_received,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 6


def held(address: str) -> set[int]:
    return {p.partition for p in status(address).partitions}


def test_prestop_handoff_moves_every_partition_before_sigterm(
    mesh: Mesh, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    config = tmp_path / "assigner.yaml"
    # Hold window 0: a pod that leaves is not coming back under its name (a Deployment's),
    # so its partitions go to the other sidecar at once.
    config.write_text(
        f"groups:\n  - name: {group}\n    topics: [{topic}]\nhold_window_seconds: 0\n"
    )
    assigner = mesh.service("assigner", "--config", str(config))
    assigner.wait_serving()
    leaving = mesh.sidecar(group, assigner, "orders-5c8d7f9b4-x2x9p")
    staying = mesh.sidecar(group, assigner, "orders-5c8d7f9b4-k7m4q")
    leaving.wait_serving()
    staying.wait_serving()
    wait_for(
        lambda: (
            len(held(leaving.grpc_addr)) + len(held(staying.grpc_addr)) == PARTITIONS
            and held(leaving.grpc_addr)
        ),
        60,
        "both sidecars to hold partitions",
    )

    client = DsClient.from_env(
        {"DS_GROUP": group, "DS_ASSIGNER": assigner.grpc_addr, "DS_CLIENT_ID": "orders-app"}
    )
    assert (client.group, client.client_id) == (group, "orders-app")
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=300).start()
    tally = Tally()
    loop = ConsumerLoop(client, tally, max_records=200).start()
    try:
        time.sleep(3)
        before = held(leaving.grpc_addr)
        started = time.monotonic()
        hook = subprocess.run(
            [sys.executable, "-m", "services.dsctl", "handoff", "--sidecar", leaving.grpc_addr,
             "--assigner", assigner.grpc_addr, "--timeout", "20"],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
        print(f"handoff of {len(before)} partitions took {took:.2f}s: {hook.stderr.strip()}")
        assert hook.returncode == 0, hook.stderr
        assert held(leaving.grpc_addr) == set()
        assert leaving.proc is not None and leaving.proc.poll() is None, "the hook stopped it"
        wait_for(
            lambda: held(staying.grpc_addr) == set(range(PARTITIONS)),
            20,
            "the staying sidecar to hold every partition",
        )
        # Run again (a retried hook), it finds nothing left and returns at once.
        again = subprocess.run(
            [sys.executable, "-m", "services.dsctl", "handoff", "--sidecar", leaving.grpc_addr,
             "--assigner", assigner.grpc_addr, "--timeout", "0"],
            capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        # The kubelet's SIGTERM after the hook: nothing is left to hand off.
        stop_started = time.monotonic()
        assert leaving.stop() == 0
        print(f"SIGTERM after the hand-off: stopped in {time.monotonic() - stop_started:.2f}s")
        time.sleep(2)
    finally:
        produced = producer.stop()
        missing = wait_received(tally, produced, timeout=60)
        time.sleep(1.5)  # anything delivered twice shows up here
        loop.stop()
        client.close()

    duplicates = tally.duplicates()
    summary = (
        f"produced {len(produced)}, received {len(tally.received())}, "
        f"deliveries {len(tally.deliveries)}, duplicates {tally.duplicate_count()} "
        f"(seqs {sorted(duplicates)[:10]}), partial acks {loop.partial_acks}"
    )
    print(summary)
    assert not loop.errors, f"the application saw errors: {loop.errors!r}"
    assert not missing, describe_missing(missing, PARTITIONS, producer=producer, tally=tally)
    assert not duplicates, f"records delivered twice: {summary}"
