"""The at-least-once accounting of the failure tests: which duplicates break the promise."""

from __future__ import annotations

from tests.support.ops import describe_deliveries, producer_copies, unexplained_duplicates
from tests.support.records import Delivery, Tally


def delivery(
    client: str, asked: float, got: float, acked: bool, answered: float, offset: int = 61
) -> Delivery:
    return Delivery(
        seq=369, partition=2, offset=offset, epoch=1, sidecar="127.0.0.1:1", fetched_at=got,
        requested_at=asked, acked=acked, acked_at=answered, client=client,
    )  # fmt: skip


def test_a_redelivery_acked_before_the_slow_refused_first_ack_is_explained() -> None:
    # Two clients: app-1 got the record first and its ack was slow and refused; app-2 got
    # it again meanwhile and acked it at once, so app-2's batch reached the tally first.
    # CI (27 Nov) read that tally order as "delivered again after an accepted ack".
    tally = Tally()
    tally.add([delivery("app-2", asked=5.0, got=5.1, acked=True, answered=5.2)])
    tally.add([delivery("app-1", asked=1.0, got=1.1, acked=False, answered=11.0)])
    assert unexplained_duplicates(tally) == {}


def test_a_record_fetched_after_its_ack_was_accepted_is_unexplained() -> None:
    tally = Tally()
    first = delivery("app-1", asked=1.0, got=1.1, acked=True, answered=1.3)
    again = delivery("app-2", asked=2.0, got=2.1, acked=True, answered=2.2)
    tally.add([again])  # whatever order the loops tallied them in
    tally.add([first])
    assert unexplained_duplicates(tally) == {369: [again, first]}
    text = describe_deliveries([again, first], origin=1.0)
    assert text.startswith("app-1 via 127.0.0.1:1 p2@61 epoch 1: asked 0.00, got 0.10")
    assert "ack accepted 0.30; app-2" in text


def test_overlapping_deliveries_are_explained_whatever_their_acks() -> None:
    # The second fetch was sent before the first ack was answered: the sidecar may have
    # handed the record out again (its ack deadline passed, its Fetch looked unsent).
    tally = Tally()
    tally.add([delivery("app-1", asked=1.0, got=1.1, acked=True, answered=3.0)])
    tally.add([delivery("app-2", asked=2.0, got=2.1, acked=True, answered=2.5)])
    assert unexplained_duplicates(tally) == {}


def test_a_record_the_producer_wrote_twice_is_two_records_to_the_mesh() -> None:
    # CI (2 Dec, Kafka down 20 s): seq 326 at p2@54 and again at p2@55. Kafka held it
    # twice (the producer's retry across the outage), so the sidecar delivering each
    # offset once is no redelivery at all; the accounting reports it as a producer copy.
    tally = Tally()
    tally.add([delivery("app-2", asked=1.0, got=1.1, acked=True, answered=1.2, offset=54)])
    tally.add([delivery("app-2", asked=2.0, got=2.1, acked=True, answered=2.2, offset=55)])
    assert unexplained_duplicates(tally) == {}
    assert producer_copies(tally) == {369: [(2, 54), (2, 55)]}
