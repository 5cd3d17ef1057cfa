"""Which bound sidecar ``DsClient.fetch`` long-polls once a sweep found nothing
(``dsclient.client.long_poll_target``): pure choice, properties over drawn
bindings and delivery histories."""

from __future__ import annotations

import grpc
from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2_grpc
from dsclient.client import long_poll_target
from dsclient.sidecar import Sidecar

CHANNEL = grpc.insecure_channel("127.0.0.1:1")  # never connected: only calls are made on it
STUB = stream_pb2_grpc.StreamServiceStub(CHANNEL)


def sidecar(i: int, partitions: int) -> Sidecar:
    return Sidecar(f"s{i}", CHANNEL, STUB, {("t", p) for p in range(partitions)})


bindings = st.lists(st.integers(0, 3), min_size=1, max_size=5).map(
    lambda counts: [sidecar(i, n) for i, n in enumerate(counts)]
)
histories = st.dictionaries(st.sampled_from([f"s{i}" for i in range(6)]), st.floats(0, 100))


@given(bindings, histories)
def test_waits_where_partitions_are_and_records_came_last(
    sidecars: list[Sidecar], delivered_at: dict[str, float]
) -> None:
    target = long_poll_target(sidecars, delivered_at)
    assert target in sidecars
    with_partitions = [s for s in sidecars if s.partitions]
    if with_partitions:
        assert target.partitions, "a sidecar the binding gives nothing has nothing to wait for"
        latest = max(delivered_at.get(s.address, float("-inf")) for s in with_partitions)
        assert delivered_at.get(target.address, float("-inf")) == latest


@given(bindings)
def test_without_a_history_the_rotation_decides(sidecars: list[Sidecar]) -> None:
    """Among equals the rotation's last one waits, as before: the client's rotation
    spreads the waits over the sidecars."""
    target = long_poll_target(sidecars, {})
    if all(bool(s.partitions) == bool(sidecars[-1].partitions) for s in sidecars):
        assert target is sidecars[-1]


def test_a_returning_sidecar_whose_partitions_are_not_live_yet_does_not_hold_the_wait() -> None:
    """The binding names a handed-back partition's new holder before that holder has
    fetched anything: the sidecar that delivered last keeps the wait."""
    back, other = sidecar(0, 4), sidecar(1, 4)
    assert long_poll_target([other, back], {"s1": 10.0}) is other
