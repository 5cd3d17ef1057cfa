"""The SQLite outbox: order, idempotent ids, atomic completion, durability across a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from services.notifier.outbox import KAFKA_LANE, WEBHOOK_LANE, Outbox, OutboxItem, Received


def item(i: int, lane: str = KAFKA_LANE) -> OutboxItem:
    return OutboxItem(id=f"id-{i}", destination="ds.faults", value=f"v{i}".encode(), lane=lane)


def test_pending_in_order_per_lane_and_ids_are_unique(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.append([item(1), item(2), item(3, WEBHOOK_LANE)])
    box.append([item(2), item(4)])  # id-2 again: ignored
    assert [i.id for i in box.pending(KAFKA_LANE, 10)] == ["id-1", "id-2", "id-4"]
    assert [i.id for i in box.pending(WEBHOOK_LANE, 10)] == ["id-3"]
    first = box.pending(KAFKA_LANE, 1)[0]
    assert [i.id for i in box.pending(KAFKA_LANE, 10, after_seq=first.seq)] == ["id-2", "id-4"]


def test_complete_forgets_and_queues_follow_ups_together(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite")
    box.append([item(1), item(2)])
    done = box.pending(KAFKA_LANE, 1)
    box.complete([done[0].seq], [item(10, WEBHOOK_LANE)])
    assert [i.id for i in box.pending(KAFKA_LANE, 10)] == ["id-2"]
    assert [i.id for i in box.pending(WEBHOOK_LANE, 10)] == ["id-10"]


def test_received_reports_answer_again(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", received_max=2)
    box.append([], received=("r1", Received("e1", True)))
    box.append([item(1)], received=("r2", Received("e2", False)))
    box.append([], received=("r3", Received("e3", False)))
    assert box.received("r2") == Received("e2", False)
    assert box.prune_received() == 1
    assert box.received("unknown") is None


def test_a_killed_writer_loses_nothing_it_committed(tmp_path: Path) -> None:
    """kill -9 right after append() returned: everything appended is there on reopen."""
    path = tmp_path / "o.sqlite"
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from services.notifier.outbox import Outbox, OutboxItem
        box = Outbox(Path({str(path)!r}))
        for i in range(200):
            box.append([OutboxItem(id=f"id-{{i}}", destination="t", value=b"x")])
            print(i, flush=True)
        os.kill(os.getpid(), {int(signal.SIGKILL)})
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    acknowledged = len(proc.stdout.split())
    box = Outbox(path)
    assert [i.id for i in box.pending(KAFKA_LANE, 1000)] == [f"id-{i}" for i in range(acknowledged)]
    assert acknowledged == 200


def test_history_keeps_the_newest(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.sqlite", history_max=3)
    box.add_history([(f"e{i}", f"{i}".encode()) for i in range(5)])
    assert box.history(10) == [b"2", b"3", b"4"]
