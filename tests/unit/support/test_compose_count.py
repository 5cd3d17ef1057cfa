"""The compose suite's record count (pure): which second deliveries are explained."""

from __future__ import annotations

from tests.compose.stack import Delivery, count

P3 = (3, 2368)


def delivery(epoch: int, ms: int, *, acked: bool, app: str) -> Delivery:
    return Delivery("7", P3[0], P3[1], epoch, ms, acked, app)


def test_a_copy_logged_late_under_an_older_lease_is_the_first_delivery() -> None:
    # app-a fetched under epoch 1, its sidecar was killed mid-ack; app-b got the record
    # under epoch 2 and acked it before app-a's failed ack returned and app-a logged it.
    result = count(
        {P3: "7"},
        [
            delivery(2, 1_000, acked=True, app="b"),
            delivery(1, 1_500, acked=False, app="a"),
        ],
    )
    assert (result.lost, result.duplicates, result.refused_then_redelivered) == (0, 1, 1)
    assert result.unexplained == []


def test_a_copy_after_an_accepted_ack_is_unexplained() -> None:
    result = count(
        {P3: "7"},
        [
            delivery(1, 1_000, acked=True, app="a"),
            delivery(2, 1_500, acked=True, app="b"),
        ],
    )
    assert result.duplicates == 1
    assert result.unexplained == [
        "p3@2368 delivered again (epoch 1 -> 2, to b) after its ack was accepted"
    ]


def test_missing_and_wrong_key() -> None:
    result = count({P3: "7", (0, 1): "8"}, [Delivery("9", 3, 2368, 1, 1, True, "a")])
    assert result.lost == 1
    assert result.unexplained == ["p3@2368 has key 9, not 7"]
