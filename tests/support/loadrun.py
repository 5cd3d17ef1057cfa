"""One mesh under load for failure tests: producer + assigner + sidecars + one application.

``LoadRun.start`` produces sequence-numbered records at a steady rate into a fresh topic,
starts an assigner with the topic's group and the named sidecars, waits for a balanced
assignment, then starts the assignment watcher and a DsClient consumer loop. ``finish``
stops the producer, drains until every produced record was delivered (bounded wait) and
returns a :class:`Result` with what was lost and what came twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsclient import DsClient
from tests.support.assignment import Assignment, AssignmentWatcher, wait_stable
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.offsets import committed_offsets
from tests.support.records import ConsumerLoop, Delivery, SeqProducer, Tally, wait_received


@dataclass
class Result:
    produced: set[int]
    missing: set[int]
    duplicates: dict[int, list[Delivery]]
    errors: list[BaseException]

    @property
    def duplicate_count(self) -> int:
        return sum(len(ds) - 1 for ds in self.duplicates.values())


@dataclass
class LoadRun:
    mesh: Mesh
    topic: str
    partitions: int
    sidecar_ids: Sequence[str]
    rate: float = 500.0
    client_id: str = "failure-app"
    group: str = ""
    assigner: ServiceProcess | None = None
    sidecars: dict[str, ServiceProcess] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    assigner_env: dict[str, str] = field(default_factory=dict)
    sidecar_env: dict[str, str] = field(default_factory=dict)  # e.g. DS_COMMIT_FENCING

    def start(self) -> Assignment:
        self.group = self.group or f"g-{self.topic}"
        self.producer = SeqProducer(
            self.mesh.bootstrap, self.topic, self.partitions, rate=self.rate
        ).start()
        self.assigner = self.mesh.assigner([(self.group, [self.topic])], env=self.assigner_env)
        self.assigner.wait_serving()
        for sid in self.sidecar_ids:
            self.sidecars[sid] = self.mesh.sidecar(
                self.group, self.assigner, sid, env=self.sidecar_env
            )
        for svc in self.sidecars.values():
            svc.wait_serving()
        initial = self.stable()
        self.watcher = AssignmentWatcher(self.addr, self.group).start()
        self.client = DsClient(self.group, client_id=self.client_id, assigner=self.addr)
        self.loop = ConsumerLoop(self.client, self.tally).start()
        self.started_at = time.monotonic()
        return initial

    @property
    def addr(self) -> str:
        assert self.assigner is not None
        return self.assigner.grpc_addr

    def stable(self, sidecars: Sequence[str] | None = None, timeout: float = 60) -> Assignment:
        ids = list(self.sidecars) if sidecars is None else list(sidecars)
        return wait_stable(self.addr, self.group, ids, self.partitions, timeout=timeout)

    def endpoint_of(self, sid: str) -> str:
        return self.sidecars[sid].grpc_addr

    def committed(self) -> dict[int, int]:
        """The group's committed offsets in Kafka, per partition (-1001 = none)."""
        return committed_offsets(self.mesh.bootstrap, self.group, self.topic, self.partitions)

    def finish(self, drain_timeout: float = 60) -> Result:
        try:
            produced = self.producer.stop()
            missing = wait_received(self.tally, produced, timeout=drain_timeout)
            time.sleep(1.5)  # anything delivered twice shows up here
        finally:
            self.loop.stop()
            self.watcher.stop()
            self.client.close()
        return Result(produced, missing, self.tally.duplicates(), list(self.loop.errors))

    def abort(self) -> None:
        """Best-effort cleanup when the test failed before finish()."""
        for name, method in (
            ("producer", "stop"),
            ("loop", "stop"),
            ("watcher", "stop"),
            ("client", "close"),
        ):
            with contextlib.suppress(Exception):  # cleanup must not mask the failure
                getattr(getattr(self, name), method)()
