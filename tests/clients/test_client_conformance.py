"""Client conformance (issue 20; docs/client-protocol.md §15): one scenario, every client.

Each client's ``dsread`` (tests/support/readers.py) reads a 6-partition topic through two
real sidecars while 10,000 records are produced, acking every batch. When it has read about
a third, the sidecar serving half of the partitions is killed with kill -9: the client must
follow the new binding by itself (no restart, no error) and read to the end. Every record
is accounted for: none lost, and the only duplicates are records of the killed sidecar's
partitions at or after their commit point at the kill (delivered, not acked or not yet
committed); within a lease epoch, a partition's first deliveries are in offset order. An
unknown group is refused with the documented error (``NOT_FOUND`` / ``GROUP_NOT_FOUND``),
checked first on the same mesh.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.accounting import report
from tests.support.assignment import holders, wait_stable
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets
from tests.support.ops import wait_for
from tests.support.reader_run import ReaderRun, copies, out_of_order
from tests.support.readers import READERS, Reader
from tests.support.records import SeqProducer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6
RECORDS = 10_000
RATE = 1000.0  # records/s: the producer runs for 10 s, so the kill finds the client reading
KILL_AFTER = 3_000  # distinct records read before the kill


@pytest.fixture(params=sorted(READERS))
def reader(request: pytest.FixtureRequest) -> Reader:
    return READERS[request.param]


@pytest.mark.parametrize("mode", ["fetch", pytest.param("stream", marks=pytest.mark.long)])
def test_reads_every_record_through_a_sidecar_kill9_and_an_unknown_group_is_refused(
    reader: Reader, mode: str, mesh: Mesh, topic_factory: object, tmp_path: Path
) -> None:
    began = time.monotonic()
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = {sid: mesh.sidecar(group, assigner, sid) for sid in ("sc-1", "sc-2")}
    for svc in sidecars.values():
        svc.wait_serving()
    before = wait_stable(assigner.grpc_addr, group, list(sidecars), PARTITIONS)
    unknown_group_is_refused(reader, assigner.grpc_addr, tmp_path)
    victim = "sc-1"
    victim_parts = {p for p, h in holders(before).items() if h == victim}

    setup_took = time.monotonic() - began
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=RATE, limit=RECORDS).start()
    run = ReaderRun(
        reader.command(
            "--assigner", assigner.grpc_addr, "--group", group,
            "--client-id", f"conformance-{reader.name}", "--expect", str(RECORDS),
            "--mode", mode, "--idle-exit-s", "60",
        ),
        tmp_path / f"dsread-{reader.name}.stderr",
    ).start()  # fmt: skip
    try:
        wait_for(lambda: run.distinct() >= KILL_AFTER, 120, f"{KILL_AFTER} records read")
        sidecars[victim].kill()
        killed_at = time.monotonic()
        committed_at_kill = committed_offsets(mesh.bootstrap, group, topic, PARTITIONS)
        code = run.wait(timeout=180)
        exited_at = time.monotonic()
    finally:
        produced = producer.stop()
    assert code == 0, f"{reader.name} dsread exited {code}:\n{run.stderr()}"

    expected = {producer.placed[seq] for seq in produced}
    seen = {(r.partition, r.offset) for r in run.records}
    lost = expected - seen
    foreign = seen - expected
    dups = copies(run.records)
    unexplained = {
        k: v for k, v in dups.items() if k[0] not in victim_parts or k[1] < committed_at_kill[k[0]]
    }
    order = out_of_order(run.records)
    moved = [r for r in run.records if r.partition in victim_parts and r.at > killed_at]
    followed = min((r.at for r in moved), default=float("nan")) - killed_at
    report(
        f"client conformance {reader.name} ({mode}): produced {len(expected)}, read "
        f"{len(seen)} distinct of {len(run.records)} delivered, lost {len(lost)}, duplicates "
        f"{len(dups)} (unexplained {len(unexplained)}: the rest were on the killed sidecar's "
        f"{len(victim_parts)} partitions at or past their commit point at the kill); kill -9 "
        f"of {victim} after {KILL_AFTER} records, its partitions read again "
        f"{followed:.2f}s later; out of order {len(order)}; acked {run.done.get('acked')}; "
        f"mesh up in {setup_took:.1f}s, reader done {exited_at - killed_at:.1f}s after the kill"
    )
    assert not lost, f"lost {len(lost)}: {sorted(lost)[:10]}"
    assert not foreign, f"records that were never produced: {sorted(foreign)[:10]}"
    assert not unexplained, f"unexplained duplicates: {list(unexplained.items())[:5]}"
    assert not order, f"out of order within an epoch: {order[:10]}"
    assert moved, "the killed sidecar's partitions were never read again"
    assert run.done.get("distinct") == RECORDS, run.done


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
