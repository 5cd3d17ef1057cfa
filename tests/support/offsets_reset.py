"""What the offsets-reset e2e tests share: a stack of one assigner and sidecars, dsctl against
it, and reading its leases and a group's committed offsets."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dsclient import DsClient
from services.devstack.kafka import KafkaHandle, TopicFactory
from services.runtime import commitmeta
from tests.support import cli, offsets
from tests.support.mesh import ServiceProcess, running_mesh
from tests.support.records import ConsumerLoop, SeqProducer, Tally
from tests.support.waiting import wait_for

PARTITIONS = 4


RATE = 200.0


BACKLOG = 800  # produced before the client starts: 200 records per partition


@dataclass
class Stack:
    bootstrap: str
    topic: str
    group: str
    assigner: ServiceProcess
    notifier: ServiceProcess
    producer: SeqProducer
    client: DsClient
    tally: Tally
    loop: ConsumerLoop
    resets: list[dict[str, Any]] = field(default_factory=list)

    def restart_loop(self) -> None:
        self.loop = ConsumerLoop(self.client, self.tally).start()


def dsctl(stack: Stack, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = cli.cli_env(DS_ASSIGNER=stack.assigner.grpc_addr, DS_NOTIFIER=stack.notifier.grpc_addr)
    return cli.dsctl(*args, env=env, timeout=timeout)


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def leases(stack: Stack) -> dict[int, tuple[str, int]]:
    """partition -> (holder, epoch), from dsctl describe."""
    doc = ok_json(dsctl(stack, "describe", stack.group, "-o", "json"))
    return {lease["partition"]: (lease["holder"], lease["epoch"]) for lease in doc["leases"]}


def rebinds(stack: Stack) -> float:
    """ds_assigner_rebinds_total of the group (0 before any)."""
    url = f"http://127.0.0.1:{stack.assigner.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    pattern = rf'^ds_assigner_rebinds_total\{{group="{re.escape(stack.group)}"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def committed(stack: Stack) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, epoch of its commit metadata), from Kafka."""
    out = {}
    for tp in offsets.committed_partitions(stack.bootstrap, stack.group, stack.topic, PARTITIONS):
        meta = commitmeta.decode(tp.metadata, tp.offset)
        out[tp.partition] = (tp.offset, meta.epoch if meta else -1)
    return out


@contextlib.contextmanager
def running_stack(
    kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory, name: str, prefix: str
) -> Iterator[Stack]:
    """A notifier, an assigner and two sidecars serving a fresh group, a producer at RATE
    and a bound client reading and acking, the backlog consumed. Shared by the offset
    reset tests (this module, test_external_reset.py, test_external_revert.py)."""
    topics = TopicFactory(kafka_cluster.bootstrap, name)
    topic = topics(PARTITIONS)
    group = f"{prefix}-{uuid.uuid4().hex[:8]}"
    log_dir: Path = tmp_path_factory.mktemp(name)
    producer = SeqProducer(kafka_cluster.bootstrap, topic, PARTITIONS, rate=RATE).start()
    try:
        with running_mesh(kafka_cluster.bootstrap, log_dir) as mesh:
            notifier = mesh.service("notifier")
            assigner = mesh.assigner([(group, [topic])], "--notifier", notifier.grpc_addr)
            notifier.wait_serving(90)
            assigner.wait_serving(90)
            for sid in ("sidecar-a", "sidecar-b"):
                mesh.sidecar(group, assigner, sid, "--notifier", notifier.grpc_addr)
            for svc in mesh.services[-2:]:
                svc.wait_serving(90)
            wait_for(lambda: producer.sent >= BACKLOG, 30, "the backlog produced")
            client_id = f"{prefix}-app"
            with DsClient(group, client_id=client_id, assigner=assigner.grpc_addr) as client:
                wait_for(lambda: len(client.endpoints) == 2, 60, "the client bound to both")
                tally = Tally()
                loop = ConsumerLoop(client, tally).start()
                s = Stack(kafka_cluster.bootstrap, topic, group, assigner, notifier, producer,
                          client, tally, loop)  # fmt: skip
                wait_for(lambda: len(tally.received()) >= BACKLOG, 90, "the backlog consumed")
                yield s
                s.loop.stop()
    finally:
        producer.stop()
        topics.delete_all()
