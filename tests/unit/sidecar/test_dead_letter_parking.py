"""Dead-letter parking (acks.py with ``park_given_up``) and the origin headers
(dead_letter.py), pure.

The promise held here: a record given up past the delivery limit is *parked*: it is never
handed out again, never comes due, and the commit point never passes it until the caller
acks it (the dead-letter topic acked it); then the commit point moves on as for any ack.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.acks import DEAD_LETTER, PartitionAcks
from services.consumer_sidecar.dead_letter import (
    ORIGIN_HEADERS,
    DeadLetterJob,
    dead_letter_headers,
    origin_headers,
    topic_for,
)
from services.runtime.topic_partition import TP

LIMIT = 2
VISIBILITY = 10.0
CLIENTS = ("a", "b")

STEPS = st.one_of(
    st.tuples(st.just("take"), st.integers(1, 8), st.sampled_from(CLIENTS)),
    st.tuples(st.just("nack"), st.integers(0, 40), st.integers(1, 10), st.sampled_from(CLIENTS)),
    st.tuples(st.just("ack"), st.integers(0, 40), st.integers(1, 5), st.sampled_from(CLIENTS)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 11.0])),
    st.tuples(st.just("release"), st.sampled_from(CLIENTS)),
    st.tuples(st.just("dead_letter")),
)


class Sim:
    """A partition of ``size`` records from offset 0, its tracker parking what it gives up,
    and the set of parked offsets the dead-letter writer has not acked yet."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.acks = PartitionAcks(0)
        self.acks.park_given_up = True
        self.position = 0
        self.now = 0.0
        self.parked: list[tuple[int, int]] = []  # given-up ranges not yet dead-lettered
        self.dead_lettered: set[int] = set()
        self.acked: set[int] = set()

    def pending(self) -> set[int]:
        return {o for lo, hi in self.parked for o in range(lo, hi)}

    def take(self, count: int, client: str) -> list[int]:
        if self.acks.refetch_from() is not None:
            self.position = self.acks.rewind()
        chunk = list(range(self.position, min(self.size, self.position + count)))
        if not chunk:
            return []
        self.position = chunk[-1] + 1
        pieces = self.acks.deliver(chunk, self.now + VISIBILITY, (client, 1))
        handed = [chunk[k] for lo, hi, _ in pieces for k in range(lo, hi)]
        assert not set(handed) & self.pending(), "a parked record was handed out again"
        assert not set(handed) & self.dead_lettered, "a dead-lettered record handed out again"
        return handed

    def given_up(self, given: list) -> None:  # type: ignore[type-arg]
        for g in given:
            assert g.parked and g.deliveries >= LIMIT
            assert g.holder != DEAD_LETTER and g.holder[0] in CLIENTS
            self.parked.append((g.lo, g.hi))

    def step(self, step: tuple) -> None:  # type: ignore[type-arg]
        kind, acks = step[0], self.acks
        if kind == "take":
            self.take(step[1], step[2])
        elif kind in ("nack", "ack"):
            lo, hi = step[1], min(step[1] + step[2], acks.next_offset)
            if hi <= lo:
                return
            if kind == "nack":
                self.given_up(acks.nack(lo, hi, step[3], self.now, 0.0, LIMIT)[1])
            else:
                try:
                    acks.ack_range(lo, hi, step[3])
                except ValueError:  # in flight to the other client: nothing applied
                    return
                self.acked |= set(range(lo, hi))
        elif kind == "advance":
            self.now += step[1]
            self.given_up(acks.expire(self.now, LIMIT))
        elif kind == "release":
            self.given_up(acks.release((step[1], 1), LIMIT))
        elif self.parked:  # the dead-letter topic acked the oldest parked range
            lo, hi = self.parked.pop(0)
            acks.ack_range(lo, hi)
            self.dead_lettered |= set(range(lo, hi))

    def check(self) -> None:
        pending = self.pending() - self.acked
        if pending:
            assert self.acks.commit_point <= min(pending), "committed past a parked record"
        for o in pending:
            assert not self.acks.is_due(o) and self.acks.holder_of(o) == DEAD_LETTER


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.lists(STEPS, max_size=60))
def test_parked_records_hold_the_commit_point_until_dead_lettered(size: int, steps: list) -> None:  # type: ignore[type-arg]
    """Whatever the clients do, a parked record is never handed out again and the commit
    point stays at or below it until it is dead-lettered (or acked by a client); at the end,
    dead-lettering what is parked and acking the rest lets the commit point reach the end,
    and every record was acked or dead-lettered."""
    sim = Sim(size)
    for step in steps:
        sim.step(step)
        sim.check()
    for _ in range(size * (LIMIT + 2) + 5):
        sim.now += VISIBILITY + 1
        sim.given_up(sim.acks.expire(sim.now, LIMIT))
        while sim.parked:
            sim.step(("dead_letter",))
        handed = sim.take(size, "a")
        if handed:
            sim.acks.ack_range(handed[0], handed[-1] + 1)
            sim.acked |= set(handed)
        elif sim.acks.commit_point >= size:
            break
        sim.check()
    assert sim.acks.commit_point == size
    assert sim.acked | sim.dead_lettered == set(range(size)), "a record neither acked nor dead"


def test_without_a_dead_letter_topic_the_commit_point_passes_what_is_given_up() -> None:
    acks = PartitionAcks(0)
    for _ in range(LIMIT):
        acks.deliver([0, 1], VISIBILITY, ("a", 1))
        acks.nack(0, 2, "a", 0.0, 0.0, LIMIT)
        acks.rewind()
    assert acks.commit_point == 2 and acks.inflight == 0


def test_a_client_may_ack_a_parked_record() -> None:
    acks = PartitionAcks(0)
    acks.park_given_up = True
    for _ in range(LIMIT):
        acks.deliver([0], VISIBILITY, ("a", 1))
        (given,) = acks.nack(0, 1, "a", 0.0, 0.0, LIMIT)[1] or [None]
        acks.rewind()
    assert given is not None and given.parked and given.holder == ("a", 1)
    assert acks.commit_point == 0 and acks.holder_of(0) == DEAD_LETTER
    assert acks.ack_range(0, 1, "b")  # an ack is a fact about the record
    assert acks.commit_point == 1


def test_origin_headers_name_the_record_and_keep_its_own() -> None:
    job = DeadLetterJob(TP("orders", 3), 7, 41, 43, 5, "app-1", "nack")
    origin = origin_headers(job, "billing", 42, 1_700_000_000_000)
    assert [name for name, _ in origin] == list(ORIGIN_HEADERS)
    assert dict(origin) == {
        "ds-dlq-topic": b"orders",
        "ds-dlq-partition": b"3",
        "ds-dlq-offset": b"42",
        "ds-dlq-timestamp": b"1700000000000",
        "ds-dlq-deliveries": b"5",
        "ds-dlq-last-error": b"nack",
        "ds-dlq-client": b"app-1",
        "ds-dlq-group": b"billing",
    }
    own = [("trace", b"t1"), ("ds-dlq-offset", b"9")]  # dead-lettered before, replayed
    headers = dead_letter_headers(own, origin)
    assert headers[:2] == [("trace", b"t1"), ("ds-dlq-previous-offset", b"9")]
    assert headers[2:] == origin


def test_the_topic_template_names_the_group() -> None:
    assert topic_for("{group}.dlq", "billing") == "billing.dlq"
    assert topic_for("", "billing") == ""
