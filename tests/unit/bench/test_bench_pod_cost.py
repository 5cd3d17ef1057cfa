"""bench_pod_cost.py's pure parts: the producer's schedule, the stamped values, reading
/proc, and the figures over the rounds (medians, bests, ratios in one round)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bench.bench_pod_cost import (
    Round,
    median_and_best,
    mesh_threads,
    path_summary,
    percentile,
)
from tests.support.pod_readers import Arrivals, records_due, stamped_value
from tests.support.proc_usage import (
    TICKS_PER_SECOND,
    Usage,
    UsageRate,
    read_threads,
    read_usage,
    schedstat_seconds,
    stat_cpu_ticks,
    status_fields,
    thread_name,
    usage_rate,
)

STAT = (
    "4242 (ds sidecar (x)) S 1 4242 4242 0 -1 4194560 12004 0 0 0 "
    "731 122 0 0 20 0 9 0 4455 1180000000 24000 18446744073709551615"
)
STATUS = """Name:\tpython
State:\tS (sleeping)
Tgid:\t4242
VmRSS:\t   98304 kB
Threads:\t9
voluntary_ctxt_switches:\t1500
nonvoluntary_ctxt_switches:\t37
"""


def test_records_due_follows_the_rate() -> None:
    assert records_due(1.0, 100) == 100
    assert records_due(0.5, 1000) == 500
    assert records_due(0.0099, 100) == 0
    assert records_due(10.0, 0) == 0  # rate 0: attached, no traffic
    assert records_due(-1.0, 100) == 0


@given(st.floats(0, 1000), st.floats(0, 1000), st.floats(0.001, 20_000))
def test_records_due_never_decreases_and_never_runs_ahead(a: float, b: float, rate: float) -> None:
    early, late = sorted((a, b))
    assert records_due(early, rate) <= records_due(late, rate)
    assert records_due(late, rate) <= late * rate


@given(st.integers(0, 10**9), st.integers(0, 2**63 - 1), st.integers(0, 4096))
def test_a_stamped_value_has_the_size_and_reads_back(seq: int, now: int, size: int) -> None:
    value = stamped_value(seq, now, size)
    assert len(value) == max(size, len(b"%d:%d:" % (seq, now)))
    arrivals = Arrivals()
    arrivals.see(value, now + 2_500_000)
    assert arrivals.first_ms == {seq: 2.5}


def test_arrivals_keep_the_first_and_count_duplicates() -> None:
    arrivals = Arrivals()
    arrivals.see(stamped_value(7, 1_000_000, 100), 3_000_000)
    arrivals.see(stamped_value(7, 1_000_000, 100), 9_000_000)
    assert arrivals.first_ms == {7: 2.0}
    assert arrivals.duplicates == 1


def test_stat_cpu_ticks_reads_utime_and_stime_after_a_name_with_parentheses() -> None:
    assert stat_cpu_ticks(STAT) == 731 + 122


def test_status_fields_reads_kilobytes_as_bytes_and_counts() -> None:
    fields = status_fields(STATUS)
    assert fields["VmRSS"] == 98304 * 1024
    assert fields["voluntary_ctxt_switches"] == 1500
    assert fields["nonvoluntary_ctxt_switches"] == 37
    assert fields["Threads"] == 9
    assert "State" not in fields and "Name" not in fields


def test_read_usage_of_this_process_grows_with_its_work() -> None:
    before = read_usage(os.getpid())
    sum(i * i for i in range(2_000_000))  # some CPU
    after = read_usage(os.getpid())
    assert after.rss > 0
    assert after.cpu >= before.cpu
    assert after.voluntary >= before.voluntary
    assert TICKS_PER_SECOND > 0


def test_thread_name_adds_up_a_pools_threads() -> None:
    assert thread_name(STAT.replace("(ds sidecar (x))", "(rdk:broker3)")) == "rdk:broker"
    assert thread_name(STAT.replace("(ds sidecar (x))", "(event_engine)")) == "event_engine"
    assert thread_name(STAT.replace("(ds sidecar (x))", "(kafka-commit_0)")) == "kafka-commit"
    assert thread_name(STAT) == "ds sidecar (x)"


def test_read_threads_names_this_process_threads_and_sums_to_the_process() -> None:
    import threading

    done = threading.Event()
    worker = threading.Thread(target=done.wait)
    worker.start()
    try:
        threads = read_threads(os.getpid())
        whole = read_usage(os.getpid())
    finally:
        done.set()
        worker.join()
    assert "main" in threads
    assert f"tid {worker.native_id}" in threads
    assert sum(u.voluntary for u in threads.values()) <= whole.voluntary
    assert sum(u.cpu for u in threads.values()) > 0


def test_usage_rate_is_per_second() -> None:
    before = Usage(cpu=10.0, rss=1, voluntary=100, involuntary=0)
    after = Usage(cpu=10.5, rss=2048, voluntary=600, involuntary=3)
    rate = usage_rate(before, after, 5.0)
    assert rate.cores == pytest.approx(0.1)
    assert rate.wakeups == pytest.approx(100.0)
    assert rate.rss == 2048
    with pytest.raises(ValueError):
        usage_rate(before, after, 0.0)


def test_schedstat_seconds_reads_the_time_on_the_cpu_in_nanoseconds() -> None:
    assert schedstat_seconds("1234567890 5550000 321\n") == pytest.approx(1.23456789)


def test_usage_rate_takes_the_nanoseconds_unless_an_ended_thread_took_its_time() -> None:
    tick = 1 / TICKS_PER_SECOND
    before = Usage(cpu=10.0, rss=1, voluntary=0, involuntary=0, ran=10.004)
    # 5 s of an idle process: 2 ticks by /proc/PID/stat, 0.0123 s by the threads' schedstat.
    idle = Usage(cpu=10.0 + 2 * tick, rss=1, voluntary=0, involuntary=0, ran=10.0163)
    assert usage_rate(before, idle, 5.0).cores == pytest.approx(0.0123 / 5)
    # A thread that used 0.5 s ended meanwhile: the live threads' sum lost it, the ticks not.
    ended = Usage(cpu=10.6, rss=1, voluntary=0, involuntary=0, ran=10.104)
    assert usage_rate(before, ended, 5.0).cores == pytest.approx(0.6 / 5)
    # No schedstat (a kernel without it): the ticks.
    plain = Usage(cpu=10.6, rss=1, voluntary=0, involuntary=0)
    assert usage_rate(before, plain, 5.0).cores == pytest.approx(0.6 / 5)


def test_read_usage_counts_the_threads_time_on_the_cpu_finer_than_ticks() -> None:
    before = read_usage(os.getpid())
    sum(i * i for i in range(200_000))  # a few milliseconds
    after = read_usage(os.getpid())
    if before.ran is None or after.ran is None:
        pytest.skip("no /proc/PID/task/TID/schedstat on this kernel: the ticks are used")
    assert 0 < after.ran - before.ran < 5


def test_percentile_and_median_and_best() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([], 0.5) != percentile([], 0.5)  # NaN
    assert median_and_best([3.0, 1.0, 2.0]) == (2.0, 1.0)


def round_of(load: float, dc: float, app: float, sidecar: float, p99: float) -> Round:
    def rate(cores: float, wakeups: float, rss: int) -> UsageRate:
        return UsageRate(cores=cores, wakeups=wakeups, rss=rss)

    return Round(
        seconds=10.0,
        load=(load, load, load),
        usage={
            "dc": {"app": rate(dc, 10.0, 2**20)},
            "da": {"app": rate(dc / 2, 5.0, 2**20)},
            "S": {"app": rate(app, 20.0, 2**21), "sidecar": rate(sidecar, 30.0, 2**22)},
        },
        p50_ms={"dc": 1.0, "da": 1.0, "S": 2.0},
        p99_ms={"dc": 5.0, "da": 5.0, "S": p99},
        missed={"dc": 0, "da": 0, "S": 1},
    )


def test_path_summary_takes_ratios_within_each_round() -> None:
    # Round 2's load doubles both sides: its ratio is still 4, as round 1's.
    rounds = [round_of(1.0, 0.01, 0.01, 0.03, 8.0), round_of(2.0, 0.02, 0.02, 0.06, 6.0)]
    s = path_summary(rounds, "S", "dc")
    assert s["total_cores"] == (pytest.approx(0.06), pytest.approx(0.04))
    assert s["ratio"] == (pytest.approx(4.0), pytest.approx(4.0))
    assert s["sidecar"]["rss_mib"] == 4.0
    assert s["app"]["wakeups_per_s"] == (20.0, 20.0)
    assert s["p99_ms"] == (7.0, 6.0)
    assert s["missed"] == 2


def test_flat_rows_give_one_row_per_idle_process_and_per_rate_and_path() -> None:
    from tests.bench.bench_pod_cost import DIRECT_PATHS, Profile, Size, as_json, flat_rows

    size = Size(100)
    size.idle = {"assigner": {"load": (2.0, 2.0, 2.0), "assigner": {
        "cores": 0.005, "wakeups": 50.0, "rss": 2**20 * 90}}}  # fmt: skip
    rnd = round_of(1.0, 0.01, 0.01, 0.03, 8.0)
    size.rates = {100.0: [rnd, rnd]}
    profile = Profile((100.0,), (100,), ("S",), 2, 1.0, 1.0)
    rows = flat_rows(as_json([size], profile, "2026-12-02T00:00:00+00:00"))
    assert rows["idle"] == [{"size": 100, "process": "assigner", "cores_pct": 0.5,
                             "wakeups_per_s": 50.0, "rss_mib": 90.0, "load": 2.0}]  # fmt: skip
    by_path = {r["path"]: r for r in rows["rates"]}
    assert set(by_path) == {*DIRECT_PATHS, "S"}
    assert by_path["S"]["total_mcores"] == 40.0
    assert by_path["S"]["x_dc"] == 4.0
    assert by_path["S"]["sidecar_mcores"] == 30.0
    assert by_path["dc"]["sidecar_mcores"] is None
    assert by_path["S"]["p99_ms"] == 8.0


def test_share_reader_output_gives_first_arrivals_and_duplicates() -> None:
    from tests.support.share_reader import arrivals

    got = arrivals(["[main] WARN preview", "lat 0 3.5", "lat 1 4.0", "lat 0 900.0",
                    "done distinct=2 received=3 acked=3 seconds=1.000"])  # fmt: skip
    assert got.first_ms == {0: 3.5, 1: 4.0}
    assert got.duplicates == 1
    assert got.error == ""
    assert "without its done line" in arrivals(["lat 0 3.5"]).error


def test_the_full_profile_runs_the_share_consumer_and_the_floor_beside_the_direct_ones() -> None:
    from tests.bench.bench_pod_cost import DIRECT_PATHS, FLOOR_PATH, FULL, SHARE_PATH, SHORT

    assert FULL.direct_paths == (*DIRECT_PATHS, SHARE_PATH, FLOOR_PATH)
    assert SHORT.direct_paths == tuple(DIRECT_PATHS)


def test_a_path_of_held_fetches_runs_the_direct_consumer_with_the_same_fetches() -> None:
    from dataclasses import replace

    from tests.bench.bench_pod_cost import DIRECT_PATHS, HELD_DIRECT, HELD_FETCHES, SHORT

    assert replace(SHORT, paths=("Su", "Sulf")).direct_paths == (*DIRECT_PATHS, HELD_DIRECT)
    assert replace(SHORT, paths=("Su", "Sl")).direct_paths == tuple(DIRECT_PATHS)
    assert HELD_FETCHES == {
        "consumer_config": "{fetch.wait.max.ms: '50', fetch.min.bytes: '1048576'}"
    }


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_a_floor_relay_frame_reads_back_its_values(values: list[bytes]) -> None:
    from tests.support.relay_floor import decode, encode

    assert decode(encode(values)) == values


def test_a_floor_relay_frame_cut_short_is_refused() -> None:
    from tests.support.relay_floor import decode, encode

    with pytest.raises(ValueError, match="past its end"):
        decode(encode([b"abc", b"defg"])[:-1])


def test_ack_checks_hold_only_the_answers_in_flight() -> None:
    from concurrent.futures import Future

    from tests.support.pod_readers import AckChecks

    acks = AckChecks()
    first, second, third = Future[int](), Future[int](), Future[int]()
    first.set_result(3)
    acks.add(first, 3)
    assert len(acks) == 0  # answered: checked and let go at once
    acks.add(second, 2)
    third.set_result(1)
    acks.add(third, 1)
    assert len(acks) == 2  # the third waits behind the second, in order
    second.set_result(2)
    acks.settle()
    assert len(acks) == 0
    short = Future[int]()
    short.set_result(1)
    with pytest.raises(RuntimeError, match="not acked whole"):
        acks.add(short, 2)


def test_mesh_threads_names_the_mesh_processes_only() -> None:
    """--threads: each mesh path's application and sidecar; not the direct or share readers,
    and not a process without a pid."""
    pids = {
        "dc": {"app": 11},
        "ds": {"app": 12},
        "S": {"app": 21, "sidecar": 22},
        "F": {"app": 31, "sidecar": 0},
    }
    assert mesh_threads(pids, ("S", "F")) == {"S app": 21, "S sidecar": 22, "F app": 31}
