"""bench_session.py's pure parts: the saturation sweep's sizes and stop rule, and the JSON
line protocol it speaks with the Go load (clients/go/cmd/sessionload)."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.bench.bench_session import (
    decode_answer,
    encode_command,
    parse_connections,
    saturated,
    sweep_sizes,
)


def row(rate: float, cpu: float, p99_ms: float) -> dict[str, float]:
    return {"rate": rate, "cpu_share": cpu, "p99_ms": p99_ms}


def test_sweep_sizes_step_up_to_the_maximum() -> None:
    assert sweep_sizes(10000) == [1000, 2000, 3000, 5000, 7000, 10000]
    assert sweep_sizes(6000) == [1000, 2000, 3000, 5000, 6000]
    assert sweep_sizes(20000) == [1000, 2000, 3000, 5000, 7000, 10000, 15000, 20000]
    assert sweep_sizes(500) == [500]


def test_a_core_that_keeps_up_is_not_saturated() -> None:
    assert saturated(2000, 1.0, row(rate=1990, cpu=0.60, p99_ms=40)) == []


@pytest.mark.parametrize(
    ("hb", "word"),
    [
        (row(rate=2000, cpu=0.95, p99_ms=40), "CPU"),  # 95 % of a core
        (row(rate=1939, cpu=0.60, p99_ms=40), "acked"),  # below 97 % of 2,000/s offered
        (row(rate=2000, cpu=0.60, p99_ms=501), "p99"),  # later than the 0.5 s safety margin
        (row(rate=0, cpu=0.60, p99_ms=float("nan")), "p99"),  # nothing acked: no latency
    ],
)
def test_each_stop_rule_alone_saturates(hb: dict[str, float], word: str) -> None:
    reasons = saturated(2000, 1.0, hb)
    assert any(word in r for r in reasons), reasons


def test_offered_rate_follows_the_interval() -> None:
    # 2,000 sidecars every 2 s offer 1,000/s: 980 acked/s is 98 %.
    assert saturated(2000, 2.0, row(rate=980, cpu=0.5, p99_ms=10)) == []
    assert saturated(2000, 2.0, row(rate=960, cpu=0.5, p99_ms=10)) != []


def test_commands_are_one_json_array_a_line() -> None:
    line = encode_command(("watch", [("t", 3), ("t", 7)]))
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert json.loads(line) == ["watch", [["t", 3], ["t", 7]]]
    assert json.loads(encode_command(("window", 1.5, 11.5))) == ["window", 1.5, 11.5]


def test_answers_take_the_python_workers_shapes() -> None:
    assert decode_answer("kill", '[["t",3],["t",7]]') == [("t", 3), ("t", 7)]
    assert decode_answer("live", '[["t",3,12.5]]') == {("t", 3): 12.5}
    assert decode_answer("live", "[]") == {}
    assert decode_answer("status", "[100,4,20,0]") == [100, 4, 20, 0]
    acks, latencies, errors = decode_answer("results", '[2,[0.001,0.002],{"UNAVAILABLE":1}]')
    assert (acks, latencies, errors) == (2, [0.001, 0.002], {"UNAVAILABLE": 1})
    assert decode_answer("window", "null") is None


def test_connections_is_a_count_or_per_sidecar() -> None:
    assert parse_connections("48") == 48
    assert parse_connections("per-sidecar") == 0
    with pytest.raises(argparse.ArgumentTypeError):
        parse_connections("0")
