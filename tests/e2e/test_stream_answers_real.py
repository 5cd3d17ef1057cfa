"""Ack answers carried by batches (``StreamOpen.answers_with_batches``, issue 34) on a real
sidecar and a real Kafka broker, at the low rates services run (about 100 records/s).

* A raw Stream that asks for it and acks every batch without ``answer_now``: every ack is
  answered exactly once, in order, all accepted; answers come inside later batches
  (``StreamBatch.ack_results``: one message less per batch), the rest on their own; the
  group's committed offsets reach the end offsets.
* ``DsClient.stream`` + ``ack_nowait`` (which asks for it): every record exactly once, every
  future says its batch was accepted, and the committed offsets reach the end offsets.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import DsClient
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import PARTITIONS, assigner_of, held_epochs, start
from tests.support.trickle import RECORDS, settled, trickle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_answers_ride_on_later_batches_and_every_ack_is_answered_once(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group, sidecar = start(mesh, topic)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        held_epochs(stub)
        producer = trickle(mesh.bootstrap, topic)
        opening = stream_pb2.StreamOpen(
            client_id="answers-app",
            group=group,
            initial_credit=stream_pb2.StreamCredit(records=1000),
            format=stream_pb2.DELIVERY_FORMAT_RECORDS,
            answers_with_batches=True,
        )
        requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()
        requests.put(stream_pb2.StreamRequest(open=opening))
        send = requests.put
        seen: set[tuple[int, int]] = set()
        acks_sent = 0
        answers: list[stream_pb2.StreamAckResult] = []
        carried = alone = 0
        call = stub.Stream(iter(requests.get, None), timeout=120)
        for response in call:
            kind = response.WhichOneof("kind")
            if kind == "ack_result":
                answers.append(response.ack_result)
                alone += 1
            else:
                assert kind == "batch", response
                answers.extend(response.batch.ack_results)
                carried += len(response.batch.ack_results)
                fresh = [r for r in response.batch.records if (r.partition, r.offset) not in seen]
                assert len(fresh) == len(response.batch.records), "a record came twice"
                seen.update((r.partition, r.offset) for r in response.batch.records)
                acks = [
                    stream_pb2.RecordAck(
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                        lease_epoch=r.lease_epoch,
                    )
                    for r in response.batch.records
                ]
                send(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(acks=acks)))
                acks_sent += 1
                if len(seen) == RECORDS:
                    send(None)  # half-close: held answers go, then the stream ends
        producer.join()

    assert len(seen) == RECORDS
    assert len(answers) == acks_sent, "every acks message answered exactly once"
    assert sum(a.acked_count for a in answers) == RECORDS
    assert not any(a.rejected_acks for a in answers)
    assert carried > 0, f"no answer rode on a batch ({alone} alone)"
    print(f"acks {acks_sent}: answers carried by batches {carried}, alone {alone}")
    committed, ends = settled(mesh.bootstrap, group, topic)
    assert committed == ends, f"committed {committed} != end offsets {ends}"


def test_stream_with_ack_nowait_delivers_every_record_once_and_commits_them(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group, _sidecar = start(mesh, topic)
    producer = trickle(mesh.bootstrap, topic)
    received: dict[int, list[int]] = defaultdict(list)
    futures: list[tuple[Future[int], int]] = []
    client = DsClient(group, client_id="answers-nowait", assigner=assigner_of(mesh))
    watchdog = threading.Timer(120, client.close)
    watchdog.start()
    try:
        batches = client.stream(max_records=1000, use_stream_rpc=True)
        for batch in batches:
            for record in batch:
                assert record.key is not None
                received[record.partition].append(int(record.key.decode()))
            futures.append((client.ack_nowait(batch), len(batch)))
            if sum(map(len, received.values())) >= RECORDS:
                break
    finally:
        watchdog.cancel()
        client.close()  # waits for the acks still on their way
    producer.join()
    expected = {p: list(range(p, RECORDS, PARTITIONS)) for p in range(PARTITIONS)}
    assert dict(received) == expected, "records missing, duplicated or out of order"
    assert [f.result(timeout=0) for f, _ in futures] == [n for _, n in futures]
    committed, ends = settled(mesh.bootstrap, group, topic)
    assert committed == ends, f"committed {committed} != end offsets {ends}"
