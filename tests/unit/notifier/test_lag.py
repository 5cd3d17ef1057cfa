"""The lag evaluator against Burrow's published rules.

The Debian ``burrow`` package (1.2.1) cannot evaluate a Kafka 4.x cluster (its offsets
request is ListOffsets v0, which Kafka 4 removed, and it cannot decode the v4 offset-commit
values Kafka 4.1 writes; see the README's lag section), so the same scenarios are checked
here against Burrow's own rule vectors: every case of ``TestCachingEvaluator_CheckRules``
(linkedin/Burrow ``core/internal/evaluator/caching_test.go``), which is Burrow's
"correctness proof for the evaluator", and the five scenarios of the issue.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from services.runtime import lag
from services.runtime.lag import Commit, Status


@dataclass(frozen=True)
class Vector:
    offsets: list[tuple[int, int, int | None]]  # offset, timestamp ms, lag (None = nil)
    broker_offsets: list[int]
    current_lag: int
    now_s: int
    status: Status


def _five(offsets: list[int], lags: list[int]) -> list[tuple[int, int, int | None]]:
    return [(o, (i + 1) * 100_000, g) for i, (o, g) in enumerate(zip(offsets, lags, strict=True))]


_SEQ = list(range(792748079, 792748094))
_SEQ_TS = [
    1512224618356, 1512224619362, 1512224620366, 1512224621367, 1512224622370,
    1512224623373, 1512224624378, 1512224625379, 1512224626383, 1512224627383,
    1512224628383, 1512224629388, 1512224630391, 1512224631394, 1512224632397,
]  # fmt: skip

BURROW_VECTORS = [
    # 0: OK, zero lag somewhere in the window
    Vector(_five([1000, 2000, 3000, 4000, 5000], [0, 50, 100, 150, 200]), [5200], 200, 600,
           Status.OK),
    # 1: not STOP: time since the last commit equals the window span, not greater
    Vector(_five([1000, 2000, 3000, 4000, 5000], [0, 50, 100, 150, 200]), [5200], 200, 900,
           Status.OK),
    # 2: STOP although lag was zero at the start (Burrow #290)
    Vector(_five([1000, 2000, 3000, 4000, 5000], [0, 50, 100, 150, 200]), [5200], 200, 1000,
           Status.STOP),
    # 3: STOP with lag always non-zero
    Vector(_five([1000, 2000, 3000, 4000, 5000], [50, 100, 150, 200, 250]), [5250], 250, 1000,
           Status.STOP),
    # 4: OK because of a zero lag, though the offset never moves
    Vector(_five([1000] * 5, [0, 50, 100, 150, 200]), [1200], 200, 600, Status.OK),
    # 5: STALL: same offset, lag always non-zero
    Vector(_five([1000] * 5, [100, 150, 200, 250, 300]), [1300], 300, 600, Status.STALL),
    # 6: still STALL with a constant lag
    Vector(_five([1000] * 5, [100] * 5), [1100], 100, 600, Status.STALL),
    # 7: REWIND: an offset goes backwards (worse than the lag decreasing)
    Vector(_five([1000, 2000, 3000, 2000, 4000], [100, 150, 200, 1250, 300]), [4300], 300, 600,
           Status.REWIND),
    # 8: OK: no current lag, though the timestamps say stopped
    Vector(_five([1000, 2000, 3000, 4000, 5000], [50, 100, 150, 200, 250]), [5250], 0, 1000,
           Status.OK),
    # 9: STOP: current lag from new data, lag in the window always zero (#290)
    Vector([(o, t, 0) for o, t in zip(_SEQ, _SEQ_TS, strict=True)],
           [792749024, 792749000, 792748800, 792748600, 792748500], 931, 1512224650,
           Status.STOP),
    # 10: OK: would be STOP, but a recent broker offset shows zero lag (#303)
    Vector([(o, t, 0) for o, t in zip(_SEQ, _SEQ_TS, strict=True)],
           [792748094, 792748093, 792748093, 792748093], 1, 1512224650, Status.OK),
    # 11: case 0 with nil lags in between, which do not change the result
    Vector([(1000, 100000, 0), (1500, 150000, None), (2000, 200000, 50), (2500, 250000, None),
            (3000, 300000, 100), (3500, 350000, None), (4000, 400000, 150),
            (4500, 450000, None), (5000, 500000, 200), (5500, 550000, None)],
           [5700], 200, 600, Status.OK),
]  # fmt: skip


@pytest.mark.parametrize("index", range(len(BURROW_VECTORS)))
def test_burrow_rule_vectors(index: int) -> None:
    v = BURROW_VECTORS[index]
    window = [Commit(o, t, g) for o, t, g in v.offsets]
    assert lag.partition_status(window, v.broker_offsets, v.current_lag, v.now_s * 1000) is (
        v.status
    ), f"Burrow vector {index}"


def run_scenario(commits: list[tuple[float, int]], highs: list[tuple[float, int]], now: float,
                 intervals: int = 5) -> lag.PartitionLag:  # fmt: skip
    """Feed commits and high-watermark polls in time order, as the monitor does."""
    window = lag.CommitWindow(intervals, min_distance_ms=1000)
    history = lag.WatermarkHistory(100, recent=intervals)
    events = sorted([(t, "h", o) for t, o in highs] + [(t, "c", o) for t, o in commits])
    for t, kind, offset in events:
        if kind == "h":
            history.add(t, offset)
        else:
            window.add(offset, int(t * 1000), history.latest)
    result = lag.evaluate_partition("t", 0, window, history, now)
    assert result is not None
    return result


# The five scenarios: a producer appends 100 records/s; high watermarks are polled
# every 0.5 s; the consumer commits once a second.
HIGHS = [(t / 2, int(t / 2 * 100)) for t in range(0, 41)]  # 0 .. 20 s


def test_scenario_keeps_up_is_ok() -> None:
    commits = [(t + 0.25, int(t * 100)) for t in range(1, 20)]  # commits what was there
    result = run_scenario(commits, HIGHS, now=20.0)
    assert result.status is Status.OK


def test_scenario_falls_behind_steadily_is_warn() -> None:
    commits = [(t + 0.25, int(t * 50)) for t in range(1, 20)]  # half the rate
    result = run_scenario(commits, HIGHS, now=19.5)
    assert result.status is Status.WARN
    assert result.lag_records > 0 and result.lag_seconds > 0


def test_scenario_stops_committing_with_lag_is_stop() -> None:
    commits = [(t + 0.25, int(t * 50)) for t in range(1, 10)]  # then nothing after 9.25 s
    result = run_scenario(commits, HIGHS, now=20.0)
    assert result.status is Status.STOP


def test_scenario_commits_the_same_offset_with_lag_is_stall() -> None:
    commits = [(t + 0.25, 300) for t in range(5, 20)]
    result = run_scenario(commits, HIGHS, now=19.5)
    assert result.status is Status.STALL


def test_scenario_seeks_backwards_is_rewind() -> None:
    offsets = [500, 600, 700, 800, 900, 950, 400, 450, 500]
    commits = [(10 + i + 0.25, o) for i, o in enumerate(offsets)]
    result = run_scenario(commits, HIGHS, now=18.5)
    assert result.status is Status.REWIND


def test_group_status_is_worst_with_errors_as_err() -> None:
    assert lag.group_status([Status.OK, Status.WARN]) is Status.WARN
    assert lag.group_status([Status.OK, Status.STALL, Status.WARN]) is Status.ERR
    assert lag.group_status([Status.REWIND]) is Status.ERR
    assert lag.group_status([]) is Status.OK


def test_min_distance_replaces_newest_and_keeps_its_timestamp() -> None:
    window = lag.CommitWindow(5, min_distance_ms=1000)
    window.add(10, 1000, 100)
    window.add(20, 1500, 100)  # within 1 s: replaces, keeps t=1000
    window.add(30, 2600, 100)
    assert [(c.offset, c.timestamp_ms, c.lag) for c in window.commits] == [
        (20, 1000, 80),
        (30, 2600, 70),
    ]
    assert window.complete == pytest.approx(0.4)


def test_incomplete_window_is_ok_below_min_complete() -> None:
    window = lag.CommitWindow(10, min_distance_ms=0)
    history = lag.WatermarkHistory(10, recent=10)
    history.add(0.0, 100)
    window.add(10, 0, 100)
    history.add(5.0, 200)
    # One commit with lag, five seconds ago: Burrow STOP, unless the window must be fuller.
    stopped = lag.evaluate_partition("t", 0, window, history, 5.0, min_complete=0.0)
    waiting = lag.evaluate_partition("t", 0, window, history, 5.0, min_complete=0.5)
    assert stopped is not None and stopped.status is Status.STOP
    assert waiting is not None and waiting.status is Status.OK


# ---- time lag ---------------------------------------------------------------------------


def test_time_lag_interpolates_between_samples() -> None:
    history = lag.WatermarkHistory(10)
    for t, offset in [(0.0, 0), (10.0, 100), (20.0, 300)]:
        history.add(t, offset)
    # Record 150 arrived when the high watermark passed 151: 10 + 51/200 * 10 s.
    assert lag.time_lag(history, 150, now_s=30.0) == pytest.approx(30.0 - 12.55)
    assert lag.time_lag(history, 300, now_s=30.0) == 0.0  # consumed everything
    assert lag.time_lag(history, 350, now_s=30.0) == 0.0


def test_time_lag_extrapolates_before_the_history() -> None:
    history = lag.WatermarkHistory(10)
    history.add(100.0, 1000)
    history.add(110.0, 2000)  # 100 records/s
    # Record 499 arrived when the watermark passed 500: 5 s before the first sample.
    assert lag.time_lag(history, 499, now_s=110.0) == pytest.approx(15.0)


def test_flat_runs_keep_their_first_and_last_sample() -> None:
    history = lag.WatermarkHistory(10)
    for t, offset in [(0.0, 0), (1.0, 50), (2.0, 50), (3.0, 50), (4.0, 50), (5.0, 150)]:
        history.add(t, offset)
    # Records 50.. arrived between t=4 (last time the watermark was 50) and t=5.
    assert history.arrival_time(50) == pytest.approx(4.01)
    assert history.arrival_time(10) == pytest.approx(0.22)


def test_truncated_log_restarts_the_history() -> None:
    history = lag.WatermarkHistory(10)
    history.add(0.0, 500)
    history.add(1.0, 10)  # the topic was recreated
    assert history.latest == 10 and len(history) == 1


@given(
    st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=30),
    st.integers(min_value=0, max_value=20_000),
)
def test_time_lag_is_monotone_in_the_committed_offset(steps: list[int], committed: int) -> None:
    """Further behind never means less lag in seconds."""
    history = lag.WatermarkHistory(100)
    offset = 0
    for i, step in enumerate(steps):
        offset += step
        history.add(float(i), offset)
    now = float(len(steps))
    assert (
        lag.time_lag(history, committed, now)
        <= lag.time_lag(history, max(committed - 1, 0), now) + 1e-9
    )


# ---- faults -----------------------------------------------------------------------------


def _group(*parts: tuple[Status, int, float]) -> lag.GroupLag:
    partitions = tuple(
        lag.PartitionLag("t", i, status, records, seconds, 1.0, 0, records)
        for i, (status, records, seconds) in enumerate(parts)
    )
    return lag.GroupLag("g", lag.group_status(p.status for p in partitions), partitions)


def test_conditions_map_statuses_and_thresholds() -> None:
    thresholds = lag.Thresholds(warn_records=100, error_records=1000, error_seconds=60)
    found = lag.conditions(
        _group(
            (Status.STOP, 10, 1.0),
            (Status.STALL, 10, 1.0),
            (Status.REWIND, 10, 1.0),
            (Status.WARN, 10, 1.0),
            (Status.OK, 500, 1.0),
            (Status.OK, 5000, 1.0),
            (Status.OK, 5, 61.0),
        ),
        thresholds,
    )
    by_type = {t: sorted(p.partition for p in c.partitions) for t, c in found.items()}
    assert by_type == {
        common_pb2.FAULT_TYPE_LAG_STOPPED: [0],
        common_pb2.FAULT_TYPE_LAG_STALLED: [1],
        common_pb2.FAULT_TYPE_LAG_REWOUND: [2],
        common_pb2.FAULT_TYPE_LAG_WARNING: [3, 4],
        common_pb2.FAULT_TYPE_LAG_ERROR: [5, 6],
    }


def test_tracker_opens_once_and_resolves_once() -> None:
    tracker = lag.LagFaultTracker()
    stalled = lag.conditions(_group((Status.STALL, 10, 1.0)), lag.Thresholds())
    first = tracker.update("g", stalled)
    again = tracker.update("g", stalled)
    cleared = tracker.update("g", {})
    assert [(t.type, t.state) for t in first] == [
        (common_pb2.FAULT_TYPE_LAG_STALLED, common_pb2.FAULT_STATE_OPEN)
    ]
    assert again == []
    assert [(t.type, t.state) for t in cleared] == [
        (common_pb2.FAULT_TYPE_LAG_STALLED, common_pb2.FAULT_STATE_RESOLVED)
    ]
    assert tracker.forget("g") == []
