"""A partition stops handing out records a margin before its local lease deadline.

Found in CI (tests/e2e/test_drain.py, 12 duplicates): while the assigner restarts for
longer than a lease TTL, each sidecar's leases expire locally (fencing: nothing is
delivered or committed past the deadline). A batch handed out a moment before the
deadline is acked a moment after it; that ack cannot be committed under the lease, so it
is refused and the records come again. With a delivery margin no record is handed out
when less than the margin is left, so what was delivered can still be acked and
committed under the lease. A real PartitionTable and LeaseKeeper; Kafka is faked at the
fetcher's edge (``stream_harness``).
"""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.session import delivery_margin_for
from tests.unit.sidecar.stream_harness import Sidecar


def sidecar(margin: float) -> Sidecar:
    sc = Sidecar()
    sc.table.delivery_margin = margin
    return sc


def test_no_record_is_handed_out_within_the_margin_of_the_deadline() -> None:
    sc = sidecar(margin=0.5)
    sc.hold(0, ttl=0.3)  # less than the margin left
    sc.buffer(0, range(0, 5))
    assert sc.table.take(10, 1 << 20) == []
    sc.hold(1, ttl=5.0)
    sc.buffer(1, range(0, 5))
    taken = sc.table.take(10, 1 << 20)
    assert {s.partition for s in taken} == {1}
    assert sum(map(len, taken)) == 5


def test_the_buffered_records_are_kept_for_when_the_lease_is_renewed() -> None:
    sc = sidecar(margin=0.5)
    part = sc.hold(0, ttl=0.3)
    sc.buffer(0, range(0, 5))
    assert sc.table.take(10, 1 << 20) == []
    part.deadline = time.monotonic() + 3.0  # a heartbeat ack renewed it
    assert sum(map(len, sc.table.take(10, 1 << 20))) == 5


def test_what_is_handed_out_before_the_margin_is_acked_and_committed_under_the_lease() -> None:
    """The ack of a batch taken just before the margin arrives before the deadline: it is
    accepted and committed. Without a margin the same batch could be taken with almost
    nothing left, and its ack would come after the deadline (refused, redelivered)."""

    async def main() -> None:
        sc = sidecar(margin=0.4)
        part = sc.hold(0, epoch=2, ttl=0.45)
        sc.buffer(0, range(0, 5))
        taken = sc.table.take(10, 1 << 20)
        assert sum(map(len, taken)) == 5
        sc.buffer(0, range(5, 10))
        await asyncio.sleep(0.1)  # now less than the margin is left
        assert sc.table.take(10, 1 << 20) == [], "nothing more within the margin"
        ack = stream_pb2.RangeAck(
            topic=part.tp.topic, partition=0, lease_epoch=2, from_offset=0, to_offset=5
        )
        assert sc.keeper.ack_range(ack) is None
        await sc.keeper.committer.commit_all()
        assert [c.offset for c in sc.fetcher.commits] == [5]

    asyncio.run(main())


def test_the_default_margin_is_off_for_a_bare_table() -> None:
    assert PartitionTable(1 << 20, time.monotonic).delivery_margin == 0.0


@given(
    setting=st.floats(0, 30),
    ttl=st.floats(0.5, 300),
    safety=st.floats(0.05, 30),
    heartbeat=st.floats(0.01, 150),
)
def test_a_lease_renewed_on_time_never_stops_delivering(
    setting: float, ttl: float, safety: float, heartbeat: float
) -> None:
    margin = delivery_margin_for(setting, ttl, safety, heartbeat)
    assert 0.0 <= margin <= setting
    least_left = ttl - safety - heartbeat  # just before the next renewal
    if least_left > 0:
        assert margin < least_left or margin == 0.0


def test_the_margin_for_the_default_lease_timing() -> None:
    assert delivery_margin_for(0.5, ttl=3.0, safety_margin=0.5, heartbeat_interval=1.0) == 0.5
    assert delivery_margin_for(0.5, ttl=1.0, safety_margin=0.5, heartbeat_interval=0.5) == 0.0
