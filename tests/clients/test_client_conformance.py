"""Client conformance (issue 20; docs/client-protocol.md §15): one scenario, every client.

Every client's ``dsread`` (tests/support/readers.py) reads the same 6-partition topic, each in
its own group served by its own two real sidecars, all at once, while 10,000 records are
produced; each acks every batch. When a client has read 3,000 records, the sidecar serving
half of its partitions is killed with kill -9: the client must follow the new binding by
itself (no restart, no error) and read to the end. Every record is accounted for, per
client: none lost, and the only duplicates are records of the killed sidecar's partitions
at or after their commit point at the kill (delivered, not acked or not yet committed);
within a lease epoch, a partition's first deliveries are in offset order. Before that, each
client asks for an unknown group and must get the documented error (``NOT_FOUND`` /
``GROUP_NOT_FOUND``). The clients run side by side so that adding one costs CI little.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.accounting import report
from tests.support.assignment import holders, wait_stable
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.offsets import committed_offsets
from tests.support.reader_run import ReaderRun, copies, out_of_order
from tests.support.readers import READERS, Reader
from tests.support.records import SeqProducer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

PARTITIONS = 6
RECORDS = 10_000
RATE = 1000.0  # records/s: the producer runs for 10 s, so the kill finds the clients reading
KILL_AFTER = 3_000  # distinct records a client has read when its sidecar is killed
SIDECARS = ("sc-1", "sc-2")  # per client; its id is <client>-<sc-N>
VICTIM = "sc-1"


@dataclass
class Lane:
    """One client's share of the scenario: its group, sidecars, run and kill."""

    reader: Reader
    group: str
    sidecars: dict[str, ServiceProcess]
    victim_parts: set[int] = field(default_factory=set)
    run: ReaderRun | None = None
    killed_at: float = 0.0
    committed_at_kill: dict[int, int] = field(default_factory=dict)
    code: int | None = None


@pytest.mark.parametrize("mode", ["fetch", pytest.param("stream", marks=pytest.mark.long)])
def test_every_client_reads_every_record_through_a_sidecar_kill9(
    mode: str, mesh: Mesh, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    groups = {name: f"g-{name}-{topic}" for name in READERS}
    assigner = mesh.assigner([(g, [topic]) for g in groups.values()])
    assigner.wait_serving()
    lanes = [
        Lane(
            reader,
            groups[name],
            {
                sid: mesh.sidecar(groups[name], assigner, f"{name}-{sid}")
                for sid in ("sc-1", "sc-2")
            },
        )
        for name, reader in sorted(READERS.items())
    ]
    for lane in lanes:
        for svc in lane.sidecars.values():
            svc.wait_serving()
        ids = [f"{lane.reader.name}-{sid}" for sid in lane.sidecars]
        before = wait_stable(assigner.grpc_addr, lane.group, ids, PARTITIONS)
        victim_id = f"{lane.reader.name}-{VICTIM}"
        lane.victim_parts = {p for p, h in holders(before).items() if h == victim_id}
        unknown_group_is_refused(lane.reader, assigner.grpc_addr, tmp_path)

    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=RATE, limit=RECORDS).start()
    try:
        for lane in lanes:
            lane.run = ReaderRun(
                lane.reader.command(
                    "--assigner", assigner.grpc_addr, "--group", lane.group,
                    "--client-id", f"conformance-{lane.reader.name}",
                    "--expect", str(RECORDS), "--mode", mode, "--idle-exit-s", "60",
                ),
                tmp_path / f"dsread-{lane.reader.name}.stderr",
            ).start()  # fmt: skip
        kill_each_after(lanes, mesh.bootstrap, topic)
        for lane in lanes:
            assert lane.run is not None
            lane.code = lane.run.wait(timeout=240)
    finally:
        produced = producer.stop()
        for lane in lanes:
            if lane.run is not None and lane.run.proc.poll() is None:
                lane.run.proc.kill()
    expected = {producer.placed[seq] for seq in produced}
    failures = [f for lane in lanes for f in account(lane, expected, mode)]
    assert not failures, "\n".join(failures)


def kill_each_after(lanes: list[Lane], bootstrap: str, topic: str) -> None:
    """kill -9 each lane's victim sidecar once its client has read ``KILL_AFTER`` records,
    noting the group's committed offsets right then (the victim can commit nothing more)."""
    pending = list(lanes)
    deadline = time.monotonic() + 120
    while pending:
        for lane in list(pending):
            assert lane.run is not None
            if lane.run.distinct() >= KILL_AFTER:
                lane.sidecars[VICTIM].kill()
                lane.killed_at = time.monotonic()
                lane.committed_at_kill = committed_offsets(bootstrap, lane.group, topic, PARTITIONS)
                pending.remove(lane)
            elif lane.run.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{lane.reader.name} dsread never read {KILL_AFTER} records "
                    f"(exit {lane.run.proc.poll()}):\n{lane.run.stderr()}"
                )
        time.sleep(0.02)


def account(lane: Lane, expected: set[tuple[int, int]], mode: str) -> list[str]:
    """Report one client's accounting line; return what it broke, if anything."""
    run, name = lane.run, lane.reader.name
    assert run is not None
    if lane.code != 0:
        return [f"{name} dsread exited {lane.code}:\n{run.stderr()}"]
    seen = {(r.partition, r.offset) for r in run.records}
    lost, foreign = expected - seen, seen - expected
    dups = copies(run.records)
    unexplained = {
        k: v
        for k, v in dups.items()
        if k[0] not in lane.victim_parts or k[1] < lane.committed_at_kill[k[0]]
    }
    order = out_of_order(run.records)
    moved = [r for r in run.records if r.partition in lane.victim_parts and r.at > lane.killed_at]
    followed = min((r.at for r in moved), default=float("nan")) - lane.killed_at
    report(
        f"client conformance {name} ({mode}): produced {len(expected)}, read {len(seen)} "
        f"distinct of {len(run.records)} delivered, lost {len(lost)}, duplicates {len(dups)} "
        f"(unexplained {len(unexplained)}: the rest were on the killed sidecar's "
        f"{len(lane.victim_parts)} partitions at or past their commit point at the kill); "
        f"kill -9 of {VICTIM} after {KILL_AFTER} records, its partitions read again "
        f"{followed:.2f}s later; out of order {len(order)}; acked {run.done.get('acked')}"
    )
    failures = []
    if lost:
        failures.append(f"{name}: lost {len(lost)}: {sorted(lost)[:10]}")
    if foreign:
        failures.append(f"{name}: records never produced: {sorted(foreign)[:10]}")
    if unexplained:
        failures.append(f"{name}: unexplained duplicates: {list(unexplained.items())[:5]}")
    if order:
        failures.append(f"{name}: out of order within an epoch: {order[:10]}")
    if not moved:
        failures.append(f"{name}: the killed sidecar's partitions were never read again")
    if run.done.get("distinct") != RECORDS:
        failures.append(f"{name}: done line {run.done}")
    return failures


def unknown_group_is_refused(reader: Reader, assigner: str, tmp_path: Path) -> None:
    """Protocol C2: ``Bind`` to an unknown group is ``NOT_FOUND`` / ``GROUP_NOT_FOUND``; the
    client surfaces it (dsread: exit 3, ``error <CODE> <REASON>``) and does not retry."""
    run = ReaderRun(
        reader.command(
            "--assigner", assigner, "--group", "no-such-group",
            "--client-id", f"conformance-{reader.name}", "--expect", "1", "--idle-exit-s", "20",
        ),
        tmp_path / f"dsread-{reader.name}-unknown.stderr",
    ).start()  # fmt: skip
    started = time.monotonic()
    code = run.wait(timeout=60)
    took = time.monotonic() - started
    errors = [line for line in run.stderr(200).splitlines() if line.startswith("error ")]
    report(
        f"client conformance {reader.name}: unknown group -> exit {code}, {errors[:1]}, "
        f"{took:.1f}s (process start included)"
    )
    assert code == 3, f"{reader.name} dsread exited {code}, want 3:\n{run.stderr()}"
    assert errors[:1] == ["error NOT_FOUND GROUP_NOT_FOUND"], run.stderr()
    assert not run.records
