"""The probe tracker: every probe ends exactly once (received, lost or failed), late
arrivals are told apart, round trips are measured on the tracker's clock, and PROBE_LOST
opens and resolves in turn."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.notifier.probe_tracker import (
    FaultChange,
    Outcome,
    ProbeMessage,
    ProbeTracker,
    decode,
)

TIMEOUT = 5.0


def test_probe_records_round_trip_through_their_encoding() -> None:
    probe = ProbeMessage("notifier-1-ab12cd34", 3, 17, 1_700_000_000_123)
    assert probe.key() == b"3"
    assert decode(probe.value()) == probe


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v": 2, "instance": "a", "partition": 0, "seq": 0, "sent_at_ms": 0}',
        b'{"v": 1, "instance": "", "partition": 0, "seq": 0, "sent_at_ms": 0}',
        b'{"v": 1, "instance": "a", "partition": -1, "seq": 0, "sent_at_ms": 0}',
        b'{"v": 1, "instance": "a", "partition": 0, "seq": "7", "sent_at_ms": 0}',
        b'{"v": 1, "instance": "a", "partition": true, "seq": 0, "sent_at_ms": 0}',
        b'{"v": 1, "instance": "a", "partition": 0, "seq": 0}',
    ],
)
def test_anything_else_on_the_probe_topic_is_rejected(value: bytes | None) -> None:
    with pytest.raises(ValueError):
        decode(value)


def test_on_time_receipt_measures_the_round_trip_on_the_tracker_clock() -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    probe = tracker.next_probe(0, now=100.0, wall_ms=1)
    receipt = tracker.received(probe, now=100.25)
    assert receipt.outcome is Outcome.RECEIVED
    assert receipt.roundtrip_seconds == pytest.approx(0.25)
    assert tracker.in_flight == 0
    assert tracker.received(probe, now=100.5).outcome is Outcome.DUPLICATE


def test_a_probe_not_received_in_time_is_lost_then_late() -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    first = tracker.next_probe(0, now=0.0, wall_ms=0)
    second = tracker.next_probe(1, now=1.0, wall_ms=0)
    assert tracker.expire(4.99) == []
    lost = tracker.expire(5.0)
    assert [(p.partition, p.seq) for p in lost] == [(0, first.seq)]
    assert tracker.failing_partitions == {0}
    late = tracker.received(first, now=7.0)
    assert late.outcome is Outcome.LATE and late.roundtrip_seconds == pytest.approx(7.0)
    # A late arrival does not clear the partition: only a probe on time does.
    assert tracker.failing_partitions == {0}
    assert tracker.received(second, now=5.5).outcome is Outcome.RECEIVED


def test_foreign_and_unknown_probes_are_not_counted() -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    tracker.next_probe(0, now=0.0, wall_ms=0)
    other = ProbeMessage("previous-run", 0, 0, 0)
    assert tracker.received(other, now=1.0).outcome is Outcome.FOREIGN
    never_sent = ProbeMessage("me", 0, 99, 0)
    assert tracker.received(never_sent, now=1.0).outcome is Outcome.FOREIGN
    assert tracker.in_flight == 1


def test_a_failed_produce_is_neither_lost_nor_received() -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    probe = tracker.next_probe(2, now=0.0, wall_ms=0)
    tracker.produce_failed(probe)
    assert tracker.expire(100.0) == []
    assert tracker.fault_change() is None


def test_the_fault_opens_once_and_resolves_when_every_failing_partition_recovers() -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    first0 = tracker.next_probe(0, now=0.0, wall_ms=0)
    tracker.next_probe(1, now=0.0, wall_ms=0)
    assert len(tracker.expire(10.0)) == 2
    assert tracker.fault_change() == FaultChange(True, (0, 1), 2)
    assert tracker.fault_change() is None  # still open: nothing new to say
    assert tracker.received(first0, now=11.0).outcome is Outcome.LATE  # changes nothing
    again0 = tracker.next_probe(0, now=11.0, wall_ms=0)
    again1 = tracker.next_probe(1, now=11.0, wall_ms=0)
    tracker.next_probe(2, now=11.0, wall_ms=0)
    assert tracker.received(again0, now=11.1).outcome is Outcome.RECEIVED
    assert tracker.failing_partitions == {1}
    assert tracker.fault_change() is None
    assert len(tracker.expire(20.0)) == 2  # again1 and partition 2's probe
    assert tracker.received(again1, now=21.0).outcome is Outcome.LATE
    assert tracker.failing_partitions == {1, 2}
    assert tracker.fault_change() is None  # the episode goes on, partition 2 joins it
    for partition in (1, 2):
        probe = tracker.next_probe(partition, now=21.0, wall_ms=0)
        assert tracker.received(probe, now=21.1).outcome is Outcome.RECEIVED
    assert tracker.fault_change() == FaultChange(False, (0, 1, 2), 4)
    assert tracker.fault_change() is None
    # A new episode starts from scratch.
    tracker.next_probe(3, now=30.0, wall_ms=0)
    tracker.expire(40.0)
    assert tracker.fault_change() == FaultChange(True, (3,), 1)


def test_a_long_stop_opens_and_resolves_once_without_flapping() -> None:
    """Probes every second; the consumer stops for 10 s, then receives every new probe at
    once while the stop's probes expire one per round: one OPEN, one RESOLVED."""
    tracker = ProbeTracker("me", TIMEOUT)
    changes: list[FaultChange] = []
    stopped = range(10, 20)
    for second in range(40):
        now = float(second)
        probes = [tracker.next_probe(p, now, wall_ms=0) for p in (0, 1)]
        if second not in stopped:
            for probe in probes:
                tracker.received(probe, now + 0.01)
        tracker.expire(now + 0.5)
        change = tracker.fault_change()
        if change is not None:
            changes.append(change)
    assert [c.opened for c in changes] == [True, False]
    assert changes[-1].partitions == (0, 1) and changes[-1].lost == 2 * len(stopped)
    assert tracker.in_flight == 0 and not tracker.failing_partitions


def test_memory_stays_bounded() -> None:
    tracker = ProbeTracker("me", TIMEOUT, remember_lost=10, max_in_flight=20)
    for i in range(100):
        tracker.next_probe(i % 4, now=float(i), wall_ms=0)
    assert tracker.in_flight == 20
    tracker.expire(1000.0)
    assert tracker.in_flight == 0
    assert len(tracker._lost) == 10
    assert not tracker._pending


# ---- property: every probe has exactly one fate ------------------------------------------


@dataclass
class _Model:
    sent: list[tuple[ProbeMessage, float]] = field(default_factory=list)
    received: set[int] = field(default_factory=set)  # seq
    lost: set[int] = field(default_factory=set)
    late: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    forgotten: set[int] = field(default_factory=set)  # lost, then reported failed


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 3)),
        st.tuples(st.just("advance"), st.floats(0.0, 4.0)),
        st.tuples(st.just("receive"), st.integers(0, 1000)),
        st.tuples(st.just("fail"), st.integers(0, 1000)),
        st.tuples(st.just("expire"), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_every_probe_ends_once_and_faults_alternate(ops: list[tuple[str, float]]) -> None:
    tracker = ProbeTracker("me", TIMEOUT)
    model = _Model()
    now = 0.0
    changes: list[FaultChange] = []
    for op, arg in ops:
        if op == "send":
            model.sent.append((tracker.next_probe(int(arg), now, 0), now))
        elif op == "advance":
            now += arg
        elif op in ("receive", "fail") and model.sent:
            probe, sent_at = model.sent[int(arg) % len(model.sent)]
            if op == "fail":
                tracker.produce_failed(probe)
                if probe.seq not in model.received | model.lost:
                    model.failed.add(probe.seq)
                elif probe.seq in model.lost:
                    model.forgotten.add(probe.seq)
                continue
            receipt = tracker.received(probe, now)
            if receipt.outcome is Outcome.RECEIVED:
                assert probe.seq not in model.received | model.lost | model.failed
                assert receipt.roundtrip_seconds == pytest.approx(now - sent_at)
                model.received.add(probe.seq)
            elif receipt.outcome is Outcome.LATE:
                assert probe.seq in model.lost
                assert probe.seq not in model.late | model.forgotten
                model.late.add(probe.seq)
            else:
                assert receipt.outcome is Outcome.DUPLICATE
                assert probe.seq in model.received | model.late | model.failed | model.forgotten
        elif op == "expire":
            for lost in tracker.expire(now):
                assert lost.seq not in model.received | model.lost | model.failed
                assert now - lost.sent_at >= TIMEOUT
                model.lost.add(lost.seq)
            change = tracker.fault_change()
            if change is not None:
                changes.append(change)
    # Conservation: each sent probe is in flight or has exactly one fate.
    fates = [model.received, model.lost, model.failed]
    for a in range(len(fates)):
        for b in range(a + 1, len(fates)):
            assert not fates[a] & fates[b]
    settled = len(model.received) + len(model.lost) + len(model.failed)
    assert settled + tracker.in_flight == len(model.sent)
    # PROBE_LOST: open, resolve, open, ... and only partitions that lost a probe.
    assert [c.opened for c in changes] == [i % 2 == 0 for i in range(len(changes))]
    lost_partitions = {p.partition for p, _ in model.sent if p.seq in model.lost}
    for change in changes:
        assert set(change.partitions) <= lost_partitions
        assert change.lost >= 1


def test_probe_value_is_small_json() -> None:
    value = ProbeMessage("host-12345678", 11, 123456, 1_700_000_000_000).value()
    assert len(value) < 120
    assert json.loads(value)["v"] == 1
