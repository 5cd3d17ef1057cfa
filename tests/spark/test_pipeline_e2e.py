"""The example pipeline on real Kafka, the mesh as processes and a real local Spark driver:
200,000 JSON records on 12 partitions, the driver killed with SIGKILL mid-stream and
restarted from its checkpoint, one of three sidecars killed with SIGKILL while the stream
runs — and every record is in the Parquet output exactly once, the windowed aggregates
agree with it, and the group's committed offsets on the broker reach the end offsets.
"""

from __future__ import annotations

import collections
import datetime as dt
import time
from pathlib import Path

import pytest

from services.devstack.kafka import TopicFactory
from tests.spark.support import (
    EVENT_BASE,
    SPARK_FLAGS,
    SparkJob,
    committed_batches,
    count_sink,
    produce_events,
    read_sink,
    sink_files,
    wait_for,
)
from tests.support.assignment import describe, wait_stable, wait_until
from tests.support.mesh import Mesh
from tests.support.offsets import committed_offsets, end_offsets

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

RECORDS = 200_000
PARTITIONS = 12
PER_TRIGGER = 25_000  # 8 batches: room to kill the driver and a sidecar mid-stream
WINDOW_SECONDS = 10


def test_pipeline_exactly_once_through_driver_and_sidecar_kills(
    mesh: Mesh, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    produced = produce_events(mesh.bootstrap, topic, RECORDS, PARTITIONS)
    assert len(produced) == RECORDS
    ends = end_offsets(mesh.bootstrap, topic, PARTITIONS)

    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = {f"sc-{i}": mesh.sidecar(group, assigner, f"sc-{i}") for i in range(3)}
    for sidecar in sidecars.values():
        sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, sidecars, PARTITIONS)

    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    events_sink, events_ckpt = output / "events", checkpoint / "events"
    args = [
        "--assigner", assigner.grpc_addr, "--group", group,
        "--output", str(output), "--checkpoint", str(checkpoint),
        "--max-records-per-trigger", str(PER_TRIGGER),
        "--window", f"{WINDOW_SECONDS} seconds", "--watermark", "5 seconds",
        *SPARK_FLAGS,
    ]  # fmt: skip

    # Run 1: kill -9 the driver once two batches are in the checkpoint.
    first = SparkJob("pipeline", args, tmp_path / "driver-1.log").start()
    try:
        wait_for("two batches", lambda: len(committed_batches(events_ckpt)) >= 2, 300, first)
        first.kill9()
    finally:
        first.stop()
    after_kill = count_sink(events_sink)
    batches_before_restart = committed_batches(events_ckpt)
    assert 0 < after_kill < RECORDS, f"the driver was not killed mid-stream ({after_kill})"
    orphans = {p for p in events_sink.glob("*.parquet")} - set(sink_files(events_sink))

    # Run 2: restart from the checkpoint; kill -9 a sidecar once it made progress.
    second = SparkJob("pipeline", args, tmp_path / "driver-2.log").start()
    try:
        wait_for(
            "a batch after the restart",
            lambda: len(committed_batches(events_ckpt)) > len(batches_before_restart),
            300,
            second,
        )
        assert count_sink(events_sink) < RECORDS, "nothing left to stream past the sidecar kill"
        victim = "sc-1"
        held = {p for p, lease in describe(assigner.grpc_addr, group).leases.items()
                if lease.holder == victim}  # fmt: skip
        sidecars[victim].kill()
        wait_for("every record in the sink", lambda: count_sink(events_sink) >= RECORDS, 400,
                 second)  # fmt: skip

        # The group's committed offsets on the broker reach the end offsets.
        deadline = time.monotonic() + 90
        committed: dict[int, int] = {}
        while time.monotonic() < deadline:
            committed = committed_offsets(mesh.bootstrap, group, topic, PARTITIONS)
            if committed == ends:
                break
            time.sleep(1)
        assert committed == ends, f"committed {committed} != end offsets {ends}"
        # The killed sidecar's partitions were read from their new owners.
        _, view = wait_until(
            assigner.grpc_addr, group,
            lambda v: all(lease.holder not in ("", victim) for lease in v.leases.values()),
            60,
        )  # fmt: skip
        moved_to = {view.leases[p].holder for p in held}
        assert held and victim not in moved_to
        # SIGTERM stops the queries and Spark cleanly.
        assert second.stop() == 0, second.tail()
    finally:
        second.stop()

    # Every record exactly once: ids, and (partition, offset) covering each log exactly.
    rows = read_sink(events_sink, ["id", "partition", "offset", "kind", "ts"])
    ids = collections.Counter(int(r["id"]) for r in rows)  # type: ignore[call-overload]
    duplicates = {i: n for i, n in ids.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} ids written more than once: {list(duplicates)[:5]}"
    assert set(ids) == produced, f"missing ids: {sorted(produced - set(ids))[:10]}"
    assert len(rows) == RECORDS
    per_partition: dict[int, list[int]] = collections.defaultdict(list)
    for r in rows:
        per_partition[int(r["partition"])].append(int(r["offset"]))  # type: ignore[call-overload]
    assert {p: sorted(o) for p, o in per_partition.items()} == {
        p: list(range(ends[p])) for p in range(PARTITIONS)
    }

    # The windowed aggregates agree with the events they cover, each window written once.
    windows = read_sink(output / "windows", ["window_start", "window_end", "kind", "events"])
    assert windows, "no window was emitted"
    keys = [(w["window_start"], w["kind"]) for w in windows]
    assert len(keys) == len(set(keys)), "a window was written twice"
    expected: collections.Counter[tuple[dt.datetime, str]] = collections.Counter()
    for r in rows:
        ts = r["ts"]
        assert isinstance(ts, dt.datetime)
        offset_s = int((ts - EVENT_BASE).total_seconds()) // WINDOW_SECONDS * WINDOW_SECONDS
        expected[(EVENT_BASE + dt.timedelta(seconds=offset_s), str(r["kind"]))] += 1
    for w in windows:
        start = w["window_start"]
        assert isinstance(start, dt.datetime)
        assert w["events"] == expected[(start.astimezone(dt.UTC), str(w["kind"]))], w

    print(
        f"\nkill -9 driver after batches {sorted(batches_before_restart)} with {after_kill} "
        f"rows committed ({len(orphans)} uncommitted files left by the crash); restart; "
        f"kill -9 {victim} holding partitions {sorted(held)} (moved to {sorted(moved_to)}); "
        f"{len(rows)} rows, {len(ids)} distinct ids, {len(windows)} windows; "
        f"committed == ends {ends}"
    )
