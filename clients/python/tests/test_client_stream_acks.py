"""``ack_nowait`` on a stream without the ack thread (issue 34): acks of records one open
stream delivered are written on it from the caller's thread and the future is resolved by
the stream's thread when their answer comes; an opening that ends before answering has
them sent again; with acks of the ack thread still on their way, the thread keeps their
order. Against a scripted sidecar (clients/python/tests/scripted.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from scripted import Assigner, Servers, Sidecar, binding, record_batch

from dataservice.sidecar.v1 import stream_pb2
from dsclient import DsClient
from dsclient.acker import Acker


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def _ack_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ds-ack"}


def test_ack_nowait_goes_on_the_stream_from_the_callers_thread_without_an_ack_thread(
    servers: Servers,
) -> None:
    seen: list[stream_pb2.StreamRequest] = []

    def script(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        next(requests)  # the open
        yield stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(batches=[record_batch(0, range(0, 3))])
        )
        acks = next(r for r in requests if r.HasField("acks"))
        seen.append(acks)
        yield stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(
                batches=[record_batch(0, range(3, 5))],
                ack_results=[stream_pb2.StreamAckResult(acked_count=1)],
            )
        )
        for _ in requests:
            pass

    sidecar = Sidecar([], streams=[script])
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    before = _ack_threads()  # another test's, if any
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream(10, use_stream_rpc=True)
        first = next(batches)
        pending = client.ack_nowait(first)
        assert [r.offset for r in next(batches)] == [3, 4]
        assert pending.result(timeout=10) == 3  # the answer the second batch carried
        assert _ack_threads() <= before  # no ack thread was started
        batches.close()
    assert not seen[0].acks.answer_now  # the sidecar may answer with its next batch
    assert [(r.partition, r.from_offset, r.to_offset) for r in seen[0].acks.ranges] == [(0, 0, 3)]
    assert not sidecar.acks  # nothing went by the Ack RPC


def test_acks_an_opening_ended_without_answering_are_sent_again(servers: Servers) -> None:
    seen: list[stream_pb2.StreamRequest] = []
    reopened = threading.Event()

    def dies(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        next(requests)
        yield stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(batches=[record_batch(0, range(0, 3))])
        )
        seen.append(next(r for r in requests if r.HasField("acks")))
        context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar went away before answering")

    def answers(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        next(requests)
        reopened.set()
        for request in requests:
            if request.HasField("acks"):
                seen.append(request)
                yield stream_pb2.StreamResponse(
                    ack_result=stream_pb2.StreamAckResult(acked_count=len(request.acks.ranges))
                )

    sidecar = Sidecar([], streams=[dies, answers])
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream(10, use_stream_rpc=True)
        pending = client.ack_nowait(next(batches))
        # Sent again on the re-opened stream, or with Ack if it was not open yet: either
        # way accepted whole.
        assert pending.result(timeout=30) == 3
        batches.close()
    again = [r.acks.ranges for r in seen[1:]] + [a.ranges for a in sidecar.acks]
    assert [(r.partition, r.from_offset, r.to_offset) for r in again[0]] == [(0, 0, 3)]


def test_with_acks_of_the_thread_on_their_way_the_thread_keeps_their_order() -> None:
    """``Acker.idle``: false while an ack is queued or being sent, true after."""
    sending, release = threading.Event(), threading.Event()

    def send(spans: list[Any], releases: Any) -> list[bool]:
        sending.set()
        release.wait(10)
        return [True] * len(spans)

    acker = Acker(send)
    try:
        assert acker.idle
        future = acker.submit([])
        assert sending.wait(10)
        assert not acker.idle  # taken off the queue, still being sent
        release.set()
        assert future.result(timeout=10) == 0
        for _ in range(100):
            if acker.idle:
                break
            threading.Event().wait(0.01)
        assert acker.idle
    finally:
        release.set()
        acker.close()
