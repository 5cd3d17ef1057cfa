"""Property tests of redelivery in the ack tracker (``acks.py``), against a model.

A partition's log (offsets with gaps) is fetched the way the partition table does it: from
a fetch position, in chunks, rewound to :meth:`PartitionAcks.rewind` whenever the tracker
says a due record lies below its cursor. Between takes, records are acked, nacked (now or
later), expired by the clock, released by a holder that went away. A plain per-offset model
says what must be true:

* every delivered record is either acked, or redelivered after its deadline, nack or holder
  end (or given up past the delivery limit);
* the commit point never passes an un-acked record;
* each delivery of a record counts one more than the one before;
* a partition's records are handed out in offset order, and a due record goes out before
  any record above it is handed out for the first time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.acks import NO_LIMIT, PartitionAcks

VISIBILITY = 10.0
CLIENTS = ("a", "b", "c")


@dataclass
class Record:
    deliveries: int = 0
    state: str = "new"  # new, inflight, due, acked, given_up
    holder: tuple[str, int] = ("", 0)
    due_at: float = math.inf


@dataclass
class Sim:
    """The tracker, the fetch position, the clock, and the model."""

    log: list[int]
    limit: int
    acks: PartitionAcks = field(init=False)
    model: dict[int, Record] = field(init=False)
    position: int = field(init=False)
    now: float = 0.0
    given_up: set[int] = field(default_factory=set)
    taken: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.acks = PartitionAcks(self.log[0])
        self.model = {o: Record() for o in self.log}
        self.position = self.log[0]

    # ---- what the partition table and the lease keeper do -------------------------------

    def take(self, count: int, holder: tuple[str, int]) -> list[int]:
        if self.acks.refetch_from() is not None:
            self.position = self.acks.rewind()  # drop the buffer, seek
        chunk = [o for o in self.log if o >= self.position][:count]
        if not chunk:
            return []
        self.position = chunk[-1] + 1
        due_before = {o for o, r in self.model.items() if r.state == "due"}
        pieces = self.acks.deliver(chunk, self.now + VISIBILITY, holder)
        handed = [chunk[k] for lo, hi, _ in pieces for k in range(lo, hi)]
        counts = {chunk[k]: n for lo, hi, n in pieces for k in range(lo, hi)}
        assert handed == sorted(handed), "handed out in offset order"
        for offset in handed:
            record = self.model[offset]
            assert record.state in ("new", "due"), f"{offset} handed out while {record.state}"
            assert counts[offset] == record.deliveries + 1, "each delivery counts one more"
            record.deliveries += 1
            record.state, record.holder, record.due_at = "inflight", holder, self.now + VISIBILITY
        skipped = set(chunk) - set(handed)
        for offset in skipped:
            assert self.model[offset].state in ("inflight", "acked", "given_up"), offset
        if handed:
            top = handed[-1]
            # A due record below what was handed out went out too: nothing overtakes it.
            assert not {o for o in due_before if o < top} - set(handed)
            assert all(self.model[o].state != "new" for o in self.log if o < top)
        self.taken.append(handed)
        return handed

    def ack(self, lo: int, hi: int) -> None:
        hi = min(hi, self.acks.next_offset)
        if hi <= lo:
            return
        self.acks.ack_range(lo, hi)
        for o in self.log:
            if lo <= o < hi and self.model[o].state in ("inflight", "due"):
                self.model[o].state = "acked"

    def nack(self, lo: int, hi: int, client: str, delay: float) -> None:
        hi = min(hi, self.acks.next_offset)
        if hi <= lo:
            return
        count, given_up = self.acks.nack(lo, hi, client, self.now, delay, self.limit)
        mine = [
            o
            for o in self.log
            if lo <= o < hi
            and self.model[o].state == "inflight"
            and self.model[o].holder[0] == client
        ]
        assert count == len(mine)
        for o in mine:
            if delay > 0:
                self.model[o].due_at = self.now + delay
            else:
                self._due(o)
        self._given_up(given_up)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        given_up = self.acks.expire(self.now, self.limit)
        for o, record in self.model.items():
            if record.state == "inflight" and record.due_at <= self.now:
                self._due(o)
        self._given_up(given_up)

    def release(self, holder: tuple[str, int]) -> None:
        given_up = self.acks.release(holder, self.limit)
        for o, record in self.model.items():
            if record.state == "inflight" and record.holder == holder:
                self._due(o)
        self._given_up(given_up)

    def _due(self, offset: int) -> None:
        record = self.model[offset]
        if self.limit != NO_LIMIT and record.deliveries >= self.limit:
            record.state = "given_up"
        else:
            record.state = "due"

    def _given_up(self, given_up: list) -> None:  # type: ignore[type-arg]
        offsets = {o for g in given_up for o in range(g.lo, g.hi)}
        for g in given_up:
            assert self.limit != NO_LIMIT and g.deliveries >= self.limit
        expected = {o for o, r in self.model.items() if r.state == "given_up"} - self.given_up
        assert offsets == expected, "given up exactly past the limit"
        self.given_up |= offsets

    # ---- what must hold after every step ------------------------------------------------

    def check(self) -> None:
        unacked = sorted(o for o, r in self.model.items() if r.state in ("inflight", "due"))
        assert self.acks.unacked() == unacked
        assert self.acks.inflight == sum(r.state == "inflight" for r in self.model.values())
        assert self.acks.due == sum(r.state == "due" for r in self.model.values())
        point = self.acks.commit_point
        assert point == (unacked[0] if unacked else self.acks.next_offset)
        # The commit point never passes a record that is not acked (or given up).
        for o in self.log:
            if o < point:
                assert self.model[o].state in ("acked", "given_up"), (o, point)
        for o in unacked:
            assert self.acks.deliveries_of(o) == self.model[o].deliveries
            assert self.acks.is_due(o) == (self.model[o].state == "due")


@st.composite
def logs(draw: st.DrawFn) -> list[int]:
    start = draw(st.integers(0, 1000))
    gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=60))
    out, current = [], start
    for gap in gaps:
        out.append(current)
        current += gap
    return out


STEPS = st.one_of(
    st.tuples(st.just("take"), st.integers(1, 12), st.sampled_from(CLIENTS), st.integers(0, 2)),
    st.tuples(st.just("ack"), st.integers(0, 200), st.integers(1, 15)),
    st.tuples(
        st.just("nack"),
        st.integers(0, 200),
        st.integers(1, 15),
        st.sampled_from(CLIENTS),
        st.sampled_from([0.0, 0.0, 3.0]),
    ),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 4.0, 11.0])),
    st.tuples(st.just("release"), st.sampled_from(CLIENTS), st.integers(0, 2)),
)


def run_steps(sim: Sim, steps: list[tuple]) -> None:  # type: ignore[type-arg]
    base = sim.log[0]
    for step in steps:
        kind = step[0]
        if kind == "take":
            sim.take(step[1], (step[2], step[3]))
        elif kind == "ack":
            sim.ack(base + step[1], base + step[1] + step[2])
        elif kind == "nack":
            sim.nack(base + step[1], base + step[1] + step[2], step[3], step[4])
        elif kind == "advance":
            sim.advance(step[1])
        else:
            sim.release((step[1], step[2]))
        sim.check()


@settings(max_examples=400, deadline=None)
@given(logs(), st.lists(STEPS, max_size=60), st.sampled_from([NO_LIMIT, 2, 3]))
def test_redelivery_matches_the_model(log: list[int], steps: list, limit: int) -> None:  # type: ignore[type-arg]
    sim = Sim(log, limit)
    run_steps(sim, steps)


@settings(max_examples=300, deadline=None)
@given(logs(), st.lists(STEPS, max_size=40), st.sampled_from([NO_LIMIT, 3]))
def test_every_record_is_acked_or_delivered_again_and_nothing_stays_in_flight(
    log: list[int],
    steps: list,
    limit: int,  # type: ignore[type-arg]
) -> None:
    """Whatever happened, once the clock passes every deadline and a client reads and acks
    everything, every record was delivered and acked (or given up past the limit), and the
    commit point reaches the end of the log."""
    sim = Sim(log, limit)
    run_steps(sim, steps)
    for _ in range(len(log) * 4 + 10):
        sim.advance(VISIBILITY + 1)
        handed = sim.take(50, ("reader", 0))
        if handed:
            sim.ack(handed[0], handed[-1] + 1)
            sim.check()
        elif sim.acks.commit_point > log[-1]:
            break
    assert all(r.state in ("acked", "given_up") for r in sim.model.values())
    assert sim.acks.commit_point == log[-1] + 1
    assert sim.acks.inflight == 0 and sim.acks.due == 0


def test_a_due_record_goes_out_before_later_ones_and_its_count_grows() -> None:
    acks = PartitionAcks(0)
    assert acks.deliver(list(range(10)), 10.0, ("a", 0)) == [(0, 10, 1)]
    assert acks.deliver(list(range(10, 20)), 10.0, ("b", 0)) == [(0, 10, 1)]
    # a's records time out; b's are acked meanwhile except 15.
    acks.ack_range(10, 15)
    acks.ack_range(16, 20)
    assert acks.expire(10.0) == []
    assert acks.due == 11 and acks.inflight == 0 and acks.commit_point == 0
    assert acks.refetch_from() == 0 and acks.rewind() == 0
    # The re-read from 0 hands out the due records again (count 2), then new ones.
    assert acks.deliver(list(range(0, 25)), 30.0, ("c", 0)) == [
        (0, 10, 2),
        (15, 16, 2),
        (20, 25, 1),
    ]
    assert acks.cursor == acks.next_offset == 25
    assert acks.deliveries_of(15) == 2 and acks.holder_of(15) == ("c", 0)


def test_a_record_past_the_limit_is_given_up_and_the_commit_point_passes_it() -> None:
    acks = PartitionAcks(100)
    acks.deliver([100, 101, 102], 1.0, ("a", 0))
    acks.ack_range(100, 101)
    acks.ack_range(102, 103)
    for delivery in (2, 3):
        acks.expire(1.0, limit=3)
        assert acks.rewind() == 101
        assert acks.deliver([101, 102], 1.0, ("a", 0)) == [(0, 1, delivery)]
    given_up = acks.expire(1.0, limit=3)
    assert [(g.lo, g.hi, g.deliveries) for g in given_up] == [(101, 102, 3)]
    assert acks.commit_point == 103 and acks.unacked() == []


def test_nacks_touch_only_the_nacking_clients_records() -> None:
    acks = PartitionAcks(0)
    acks.deliver([0, 1, 2], math.inf, ("a", 0))
    acks.deliver([3, 4], math.inf, ("b", 7))
    count, _ = acks.nack(0, 5, "b", now=0.0)
    assert count == 2 and [acks.is_due(o) for o in range(5)] == [False] * 3 + [True] * 2
    count, _ = acks.nack(0, 2, "a", now=0.0, delay=5.0)
    assert count == 2 and acks.next_deadline() == 5.0 and acks.inflight == 3
    assert acks.expire(5.0) == [] and acks.due == 4
    assert acks.release(("a", 0)) == [] and acks.due == 5


def test_due_records_kafka_no_longer_has_are_dropped_on_the_re_read() -> None:
    acks = PartitionAcks(0)
    acks.deliver([0, 1, 2, 3, 4], 0.0, ("a", 0))
    acks.expire(0.0)
    assert acks.rewind() == 0
    # Compaction removed 1 and 2 meanwhile: the re-read finds 0, 3, 4.
    assert acks.deliver([0, 3, 4, 5], 9.0, ("a", 0)) == [(0, 3, 2), (3, 4, 1)]
    assert acks.unacked() == [0, 3, 4, 5] and acks.due == 0
