"""Ack answers carried by batches (``StreamOpen.answers_with_batches``, issue 34): the client
asks for them on every stream; ``ack_nowait`` lets the sidecar answer with its next batch
(``answer_now`` unset), ``ack`` asks for its answer now; an answer that comes inside a batch
resolves its ack exactly as an ``ack_result`` does, in order. Against a scripted sidecar
(clients/python/tests/scripted.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from scripted import Assigner, Servers, Sidecar, binding, record_batch

from dataservice.sidecar.v1 import stream_pb2
from dsclient import DsClient


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def test_ack_nowait_answers_ride_on_the_next_batch_and_ack_asks_for_its_answer_now(
    servers: Servers,
) -> None:
    seen: list[stream_pb2.StreamRequest] = []

    def script(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        seen.append(next(requests))  # the open
        yield stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(batches=[record_batch(0, range(0, 3))])
        )
        # ack_nowait of the first batch: answered by the second batch, with a refusal in
        # it so the count shows the answer was the one read.
        first = next(r for r in requests if r.HasField("acks"))
        seen.append(first)
        answer = stream_pb2.StreamAckResult(
            acked_count=0,
            rejected_ranges=[
                stream_pb2.RejectedRangeAck(
                    ack=first.acks.ranges[0], reason=stream_pb2.REJECT_REASON_STALE_EPOCH
                )
            ],
        )
        yield stream_pb2.StreamResponse(
            batch=stream_pb2.StreamBatch(
                batches=[record_batch(0, range(3, 5))], ack_results=[answer]
            )
        )
        # ack of the second: asked for now, answered on its own.
        second = next(r for r in requests if r.HasField("acks"))
        seen.append(second)
        yield stream_pb2.StreamResponse(ack_result=stream_pb2.StreamAckResult(acked_count=1))
        for _ in requests:
            pass

    sidecar = Sidecar([], streams=[script])
    assigner = Assigner(binding(1, servers.sidecar(sidecar)))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        batches = client.stream(10, use_stream_rpc=True)
        first = next(batches)
        assert [r.offset for r in first] == [0, 1, 2]
        pending = client.ack_nowait(first)
        second = next(batches)
        assert [r.offset for r in second] == [3, 4]
        assert pending.result(timeout=10) == 0  # the refusal the batch carried
        assert client.ack(second) == 2
        batches.close()
    opened, nowait, waited = seen
    assert opened.open.answers_with_batches
    assert not nowait.acks.answer_now and waited.acks.answer_now
    assert not sidecar.acks  # nothing went by the Ack RPC
