"""Assigner acceptance: scale out 2 → 3 → 4 sidecars and back in to 3, under load.

Real Kafka, a 24-partition topic, real assigner and sidecar processes, a producer running
throughout and one application (DsClient) fetching and acking synchronously. Every record
is counted end to end. At every step the assigner must move exactly the lower bound of
partitions (scale-out: the newcomer's share; scale-in: the leaver's partitions), take them
only from over-quota sidecars, move each at most once, and deliver nothing twice: acks are
synchronous, so a cooperative handoff (revoke → drain → commit → grant at the committed
offset) must never redeliver.
"""

from __future__ import annotations

import math
import time

import pytest

from dsclient import DsClient
from tests.support.assignment import (
    AssignmentWatcher,
    GroupView,
    counts,
    moved,
    wait_stable,
    wait_until,
)
from tests.support.mesh import Mesh
from tests.support.records import (
    ConsumerLoop,
    SeqProducer,
    Tally,
    describe_missing,
    wait_received,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 24
RATE = 500  # records/s, produced throughout


def _share_of(sidecar: str, share: int) -> object:
    def held(view: GroupView) -> bool:
        mine = [v for v in view.leases.values() if v.holder == sidecar and v.granted]
        return len(mine) >= share

    return held


def test_scale_out_2_3_4_then_in_to_3(mesh: Mesh, topic_factory: object) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=RATE).start()

    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    addr = assigner.grpc_addr
    sidecars = {sid: mesh.sidecar(group, assigner, sid) for sid in ("sc-1", "sc-2")}
    for svc in sidecars.values():
        svc.wait_serving()
    before = wait_stable(addr, group, sidecars, PARTITIONS)

    watcher = AssignmentWatcher(addr, group).start()
    tally = Tally()
    client = DsClient(group, client_id="scaling-app", assigner=addr)
    loop = ConsumerLoop(client, tally).start()
    report: list[str] = []
    try:
        time.sleep(2)  # steady state under load before the first step
        for n_after, sid in ((3, "sc-3"), (4, "sc-4")):
            step_start = time.monotonic()
            sidecars[sid] = mesh.sidecar(group, assigner, sid)
            sidecars[sid].wait_serving()
            serving_at = time.monotonic()
            share = PARTITIONS // n_after
            first_at, _ = wait_until(addr, group, _share_of(sid, 1), timeout=30)  # type: ignore[arg-type]
            full_at, _ = wait_until(addr, group, _share_of(sid, share), timeout=30)  # type: ignore[arg-type]
            after = wait_stable(addr, group, sidecars, PARTITIONS)
            moves = moved(before, after)
            quota = math.ceil(PARTITIONS / n_after)
            old_counts = counts(before)
            report.append(
                f"{n_after - 1}->{n_after}: moved {len(moves)} (lower bound {share}); "
                f"from {dict(sorted(counts({p: before[p] for p in moves}).items()))}; "
                f"counts {dict(sorted(counts(after).items()))}; "
                f"first lease {first_at - serving_at:+.2f}s / full share "
                f"{full_at - serving_at:+.2f}s after SERVING "
                f"(process start -> SERVING {serving_at - step_start:.2f}s)"
            )
            print(report[-1])
            assert len(moves) == share, f"moved {len(moves)} partitions, lower bound {share}"
            assert all(new == sid for _, new in moves.values()), f"moves not to {sid}: {moves}"
            assert all(old_counts[old] > quota for old, _ in moves.values()), (
                f"a partition came from a sidecar at or under quota {quota}: {moves} {old_counts}"
            )
            for p in range(PARTITIONS):
                path = watcher.holder_sequence(p, since=step_start)
                want = [before[p].holder, sid] if p in moves else [before[p].holder]
                assert path == want, f"partition {p} went {path}, expected {want}"
            # A generous bound (the target is one heartbeat, 1 s; printed above).
            assert full_at - serving_at < 10, "the new sidecar did not get its share in time"
            before = after
            time.sleep(2)

        # Scale in 4 -> 3 with SIGTERM: only the leaver's partitions move.
        step_start = time.monotonic()
        leaver = "sc-4"
        held = sorted(p for p, v in before.items() if v.holder == leaver)
        assert sidecars.pop(leaver).stop() == 0
        stopped_at = time.monotonic()
        after = wait_stable(addr, group, sidecars, PARTITIONS)
        moves = moved(before, after)
        regranted = [watcher.first_seen(p, after[p].holder, since=step_start) for p in moves]
        latest = max((t for t in regranted if t is not None), default=stopped_at)
        report.append(
            f"4->3 (SIGTERM {leaver}): moved {len(moves)} (the leaver held {len(held)}); "
            f"last one granted elsewhere {latest - step_start:.2f}s after the SIGTERM "
            f"(hold_mode handoff, the default: at once); "
            f"to {dict(sorted(counts({p: after[p] for p in moves}).items()))}; "
            f"counts {dict(sorted(counts(after).items()))}; stop took "
            f"{stopped_at - step_start:.2f}s"
        )
        print(report[-1])
        assert sorted(moves) == held, f"moved {sorted(moves)}, the leaver held {held}"
        for p in range(PARTITIONS):
            path = watcher.holder_sequence(p, since=step_start)
            want = [leaver, after[p].holder] if p in moves else [before[p].holder]
            assert path == want, f"partition {p} went {path}, expected {want}"
        time.sleep(2)
    finally:
        produced = producer.stop()
        missing = wait_received(tally, produced, timeout=60)
        time.sleep(1.5)  # anything delivered twice shows up here
        loop.stop()
        watcher.stop()
        client.close()

    duplicates = tally.duplicates()
    summary = (
        f"produced {len(produced)}, received {len(tally.received())}, "
        f"deliveries {len(tally.deliveries)}, duplicates {tally.duplicate_count()} "
        f"(seqs {sorted(duplicates)[:10]}), partial acks {loop.partial_acks}"
    )
    print(summary)
    print("\n".join(report))
    assert not loop.errors, f"the application saw errors: {loop.errors!r}"
    assert not missing, describe_missing(missing, PARTITIONS, producer=producer, tally=tally)
    assert not duplicates, f"records delivered twice: {summary}"
