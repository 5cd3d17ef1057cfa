"""Acks carried by the next Fetch (``FetchRequest.ack_ranges``, issue 34): a fetch loop's
``ack_nowait`` goes inside its next ``fetch()`` to the same sidecar instead of an Ack call of
its own, and its future resolves from the answer (``FetchResponse.acks``, in that response
or a later one); acks no fetch carries in time, acks whose answer does not come, and every
ack to a sidecar that does not read them (older than the field), go by Ack as before.
Against a scripted sidecar (clients/python/tests/scripted.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scripted import Assigner, Servers, Sidecar, binding, record_batch, wait_for

from dsclient import DsClient


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def ranges(acks: list) -> list[tuple[int, int, int]]:  # type: ignore[type-arg]
    return [(r.partition, r.from_offset, r.to_offset) for r in acks]


def test_a_fetch_loop_acks_ride_in_its_next_fetch(servers: Servers) -> None:
    sidecar = Sidecar([], reads_carried_acks=True, refuse_partition=1)
    for partition, offsets in ((0, range(0, 3)), (1, range(0, 2)), (0, range(3, 5))):
        sidecar.fetch_batches.put(record_batch(partition, offsets))
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        first = client.fetch(10, max_wait=2)
        assert [r.offset for r in first] == [0, 1, 2]
        pending_first = client.ack_nowait(first)
        second = client.fetch(10, max_wait=2)  # carries the first batch's acks
        assert [(r.partition, r.offset) for r in second] == [(1, 0), (1, 1)]
        assert pending_first.result(10) == 3
        pending_second = client.ack_nowait(second)
        third = client.fetch(10, max_wait=2)  # carries the second's: refused (stale epoch)
        assert [r.offset for r in third] == [3, 4]
        assert pending_second.result(10) == 0
        # Nothing fetches any more: the last ack goes by Ack after a short wait.
        assert client.ack_nowait(third).result(10) == 2
    assert [ranges(c) for c in sidecar.carried] == [[(0, 0, 3)], [(1, 0, 2)]]
    assert [ranges(a.ranges) for a in sidecar.acks] == [[(0, 3, 5)]]


def test_acks_to_a_sidecar_that_does_not_read_them_go_by_ack(servers: Servers) -> None:
    sidecar = Sidecar([])  # ignores ack_ranges, as a sidecar older than the field does
    for offsets in (range(0, 3), range(3, 5), range(5, 6)):
        sidecar.fetch_batches.put(record_batch(0, offsets))
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        first = client.fetch(10, max_wait=2)
        pending_first = client.ack_nowait(first)
        second = client.fetch(10, max_wait=2)  # carries them; no answer: sent by Ack
        assert pending_first.result(10) == 3
        pending_second = client.ack_nowait(second)
        client.fetch(10, max_wait=2)  # this sidecar's acks are not offered to fetches now
        assert pending_second.result(10) == 2
        wait_for(lambda: len(sidecar.acks) == 2)
    assert [ranges(a.ranges) for a in sidecar.acks] == [[(0, 0, 3)], [(0, 3, 5)]]


def test_answers_may_come_with_a_later_response_or_else_the_acks_go_by_ack(
    servers: Servers,
) -> None:
    sidecar = Sidecar([], reads_carried_acks=True, defer_answers=True)
    for offsets in (range(0, 3), range(3, 5), range(5, 6)):
        sidecar.fetch_batches.put(record_batch(0, offsets))
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        first = client.fetch(10, max_wait=2)
        pending_first = client.ack_nowait(first)
        second = client.fetch(10, max_wait=2)  # carries them; their answer comes later
        assert not pending_first.done()
        pending_second = client.ack_nowait(second)
        # The first's answer is awaited: this fetch carries nothing (one commit at a time;
        # what queues up meanwhile goes together) and brings that answer.
        client.fetch(10, max_wait=2)
        assert pending_first.result(1) == 3
        assert pending_second.result(10) == 2  # not carried in time: sent with Ack
        pending_third = client.ack_nowait(second)  # acked again: nothing awaited now
        client.fetch(10, max_wait=0.5)  # carries it; its answer is left for later
        # No fetch brings that answer: after a while the acks go by Ack (again).
        assert pending_third.result(10) == 2
    assert [ranges(c) for c in sidecar.carried] == [[(0, 0, 3)], [(0, 3, 5)]]
    assert [ranges(a.ranges) for a in sidecar.acks] == [[(0, 3, 5)], [(0, 3, 5)]]
