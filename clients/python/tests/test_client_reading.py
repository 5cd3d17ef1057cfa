"""How DsClient reads from its sidecars (docs/client-protocol.md §6, §7): the fetch
rotation and its ``max_wait``, and ``Stream`` calls that end. Against scripted in-process
sidecars (clients/python/tests/scripted.py) that log every request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from scripted import (
    Assigner,
    FetchSeen,
    Servers,
    Sidecar,
    abort,
    binding,
    idle,
    record_batch,
    wait_for,
)

from dataservice.sidecar.v1 import stream_pb2
from dsclient import DsClient

MAX_WAIT = 1.0  # seconds: far more than a sweep of three local calls, even on a loaded box


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def test_a_fetch_sweeps_every_sidecar_with_max_wait_zero_then_long_polls_the_last(
    servers: Servers,
) -> None:
    """C18 and C50: a pass asks each bound sidecar without waiting (``max_wait`` present
    and 0: unset would mean the sidecar's 0.5 s), the next pass starts one further and
    long-polls its last sidecar with what is left of ``max_wait``."""
    fetches: list[FetchSeen] = []
    addresses = sorted(servers.sidecar(Sidecar(fetches)) for _ in range(3))
    assigner = Assigner(binding(1, *addresses))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        assert client.fetch(10, max_wait=MAX_WAIT) == []
        asked = [f.address for f in fetches]
        first, second = asked[:3], asked[3:]
        assert sorted(first) == addresses  # every sidecar swept ...
        assert all(f.max_wait_present and f.max_wait == 0 for f in fetches[:3])  # ... at once
        start = addresses.index(first[0])
        assert first == addresses[start:] + addresses[:start]  # in order, from a start ...
        assert second == first[1:] + first[:1]  # ... that moves on by one at the next pass
        assert all(f.max_wait_present and f.max_wait == 0 for f in fetches[3:5])
        assert 0 < fetches[5].max_wait <= MAX_WAIT  # the last of the rotation long-polls
        fetches.clear()
        client.fetch(10, max_wait=0.1)
        assert fetches[0].address == second[1]  # and the next fetch starts one further


def test_one_bound_sidecar_is_long_polled_at_once(servers: Servers) -> None:
    """C18: with a single sidecar there is nothing to sweep."""
    fetches: list[FetchSeen] = []
    address = servers.sidecar(Sidecar(fetches))
    assigner = Assigner(binding(1, address))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        assert client.fetch(10, max_wait=MAX_WAIT) == []
        assert len(fetches) == 1 and MAX_WAIT / 2 < fetches[0].max_wait <= MAX_WAIT


def batch_then(
    offsets: range, end: grpc.StatusCode | None, *, on_ack: bool
) -> Any:  # a Sidecar.streams script
    """A stream that sends one batch of partition 0, then ends with ``end`` (None: OK)
    at once or, with ``on_ack``, when the client acks on it (leaving the ack unanswered)."""

    def script(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        next(requests)  # the open
        batch = stream_pb2.StreamBatch(batches=[record_batch(0, offsets)])
        yield stream_pb2.StreamResponse(batch=batch)
        if on_ack:
            for request in requests:
                if request.HasField("acks"):
                    break
        if end is not None:
            abort(context, end)

    return script


def test_a_stream_ended_unavailable_is_opened_again_and_its_pending_ack_goes_by_the_ack_rpc(
    servers: Servers,
) -> None:
    """C26."""
    sidecar = Sidecar([], streams=[batch_then(range(5), grpc.StatusCode.UNAVAILABLE, on_ack=True)])
    sidecar.streams.append(idle)
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream(10, use_stream_rpc=True)
        batch = next(batches)
        assert [r.offset for r in batch] == [0, 1, 2, 3, 4]
        assert client.ack(batch) == 5  # sent on the stream, which ended: by the Ack RPC
        (ack,) = sidecar.acks
        assert [(r.partition, r.from_offset, r.to_offset) for r in ack.ranges] == [(0, 0, 5)]
        wait_for(lambda: sidecar.opened == 2)  # and the stream is opened again
        batches.close()


def test_a_stream_that_ends_cleanly_is_opened_again(servers: Servers) -> None:
    """C53: a clean end says nothing about the binding."""
    sidecar = Sidecar(
        [],
        streams=[
            batch_then(range(0, 5), None, on_ack=False),
            batch_then(range(5, 10), None, on_ack=True),
        ],
    )
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream(10, use_stream_rpc=True)
        got: list[int] = []
        while len(got) < 10:  # two batches, or one when a slow reader finds both there
            got += [r.offset for r in next(batches)]
        assert got == list(range(10)) and sidecar.opened == 2
        batches.close()
