"""Stream, ReadRange and CommitOffsets of a real sidecar on a real Kafka broker.

* Stream (through the client library's ``use_stream_rpc``): every record exactly once with
  credits and acks, and the group's committed offsets reach the end offsets.
* ReadRange returns exactly [from, to) of a held partition, chunked, with the lease epoch.
* CommitOffsets commits (as Kafka's AdminClient sees it) and refuses a stale epoch.
* Bad requests get the documented status and ErrorInfo reason.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import DsClient
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import (
    PARTITIONS,
    assigner_of,
    failing,
    held_epochs,
    retry_not_ready,
    start,
)
from tests.support.walking_skeleton import committed_offsets, end_offsets, produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_stream_rpc_delivers_every_record_exactly_once(mesh: Mesh, topic_factory: Any) -> None:
    records = 3000
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(mesh.bootstrap, topic, records)
    group, _sidecar = start(mesh, topic)

    received: dict[int, list[int]] = defaultdict(list)
    duplicates = 0
    client = DsClient(group, client_id="stream-app", assigner=assigner_of(mesh))
    watchdog = threading.Timer(120, client.close)
    watchdog.start()
    closer: threading.Timer | None = None
    try:
        for batch in client.stream(max_records=200, use_stream_rpc=True):
            assert len(batch) <= 200, "more records than the credit allows"
            for record in batch:
                key = int(record.key.decode())
                assert record.lease_epoch >= 1 and record.topic == topic
                if key in received[record.partition]:
                    duplicates += 1
                received[record.partition].append(key)
            if closer is None:
                assert client.ack(batch) == len(batch)
            if closer is None and sum(map(len, received.values())) >= records:
                # Everything arrived: anything in the next 1.5 s would be a duplicate.
                closer = threading.Timer(1.5, client.close)
                closer.start()
    finally:
        watchdog.cancel()
        client.close()

    assert duplicates == 0
    assert dict(received) == dict(expected), "records missing, duplicated or out of order"
    ends = end_offsets(mesh.bootstrap, topic)
    deadline = time.monotonic() + 15
    committed: dict[int, int] = {}
    while time.monotonic() < deadline:
        committed = committed_offsets(mesh.bootstrap, group, topic)
        if committed == ends:
            break
        time.sleep(0.5)
    assert committed == ends, f"committed {committed} != end offsets {ends}"


def test_read_range_commit_offsets_and_bad_requests(mesh: Mesh, topic_factory: Any) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(mesh.bootstrap, topic, 1200)  # 100 records per partition
    group, sidecar = start(mesh, topic)
    ends = end_offsets(mesh.bootstrap, topic)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        epochs = held_epochs(stub)

        def read(**kw: Any) -> list[stream_pb2.ReadRangeResponse]:
            fields: dict[str, Any] = {"client_id": "spark", "group": group, "topic": topic}
            fields.update(kw)
            return list(stub.ReadRange(stream_pb2.ReadRangeRequest(**fields), timeout=30))

        # ---- ReadRange: exactly [from, to), in chunks, with the lease epoch ----------
        responses = retry_not_ready(
            lambda: read(partition=1, from_offset=3, to_offset=57, max_bytes=300)
        )
        assert len(responses) > 1, "max_bytes should have split the range"
        offsets = [r.offset for resp in responses for r in resp.records]
        assert offsets == list(range(3, 57))
        keys = [int(r.key.decode()) for resp in responses for r in resp.records]
        assert keys == expected[1][3:57]
        assert {resp.lease_epoch for resp in responses} == {epochs[1]}
        assert {r.lease_epoch for resp in responses for r in resp.records} == {epochs[1]}
        for chunk, following in itertools.pairwise(responses):
            assert chunk.next_offset == following.records[0].offset
        assert responses[-1].next_offset == 57
        whole = read(partition=2, from_offset=0, to_offset=ends[2])
        assert [r.offset for resp in whole for r in resp.records] == list(range(ends[2]))
        empty = read(partition=2, from_offset=ends[2], to_offset=ends[2])
        assert [(len(r.records), r.next_offset) for r in empty] == [(0, ends[2])]
        # ARROW_IPC: the same records as Arrow IPC streams, one per chunk, within max_bytes.
        arrow = read(
            partition=2,
            from_offset=0,
            to_offset=ends[2],
            max_bytes=8192,
            format=stream_pb2.READ_FORMAT_ARROW_IPC,
        )
        assert len(arrow) > 1 and all(not resp.records for resp in arrow)
        assert all(resp.ByteSize() <= 8192 for resp in arrow)
        tables = [pa_ipc.open_stream(resp.arrow_ipc).read_all() for resp in arrow]
        assert [t.column("offset")[0].as_py() for t in tables[1:]] == [
            resp.next_offset for resp in arrow[:-1]
        ]
        assert arrow[-1].next_offset == ends[2]
        rows = [row for t in tables for row in t.to_pylist()]
        records = [r for resp in whole for r in resp.records]
        assert [(row["offset"], row["key"], row["value"]) for row in rows] == [
            (r.offset, r.key, r.value) for r in records
        ]
        assert {(row["topic"], row["partition"]) for row in rows} == {(topic, 2)}
        micros = [v for t in tables for v in t.column("timestamp").cast(pa.int64()).to_pylist()]
        assert micros == [
            r.timestamp.seconds * 1_000_000 + r.timestamp.nanos // 1000 for r in records
        ]
        # Reading did not move the group: nothing is committed yet.
        assert set(committed_offsets(mesh.bootstrap, group, topic).values()) == {-1001}

        # ---- CommitOffsets: commits, fenced by epoch ------------------------------------
        def commit(partition: int, offset: int, epoch: int) -> stream_pb2.OffsetCommitResult:
            request = stream_pb2.CommitOffsetsRequest(
                client_id="spark",
                group=group,
                offsets=[
                    stream_pb2.OffsetCommit(
                        topic=topic, partition=partition, offset=offset, lease_epoch=epoch
                    )
                ],
            )
            (result,) = stub.CommitOffsets(request, timeout=10).results
            return result

        # A commit moves the group only past records ReadRange gave this client, every one
        # of them (issue 37, finding 9): [3, 57) was read, [0, 3) not yet.
        gap = commit(1, 57, epochs[1])
        assert (gap.committed, gap.reason) == (False, stream_pb2.REJECT_REASON_NOT_DELIVERED)
        assert [r.offset for resp in read(partition=1, to_offset=3) for r in resp.records] == [
            0,
            1,
            2,
        ]
        result = commit(1, 57, epochs[1])
        assert result.committed and result.reason == stream_pb2.REJECT_REASON_UNSPECIFIED
        assert committed_offsets(mesh.bootstrap, group, topic)[1] == 57
        stale = commit(1, 80, epochs[1] - 1)
        assert (stale.committed, stale.reason) == (False, stream_pb2.REJECT_REASON_STALE_EPOCH)
        beyond = commit(1, ends[1] + 5, epochs[1])
        assert (beyond.committed, beyond.reason) == (
            False,
            stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
        )
        # Below the committed offset: a commit never goes backward.
        backward = commit(1, 10, epochs[1])
        assert (backward.committed, backward.reason) == (
            False,
            stream_pb2.REJECT_REASON_OFFSET_OUT_OF_RANGE,
        )
        time.sleep(1.5)  # a periodic commit round: it must not move the explicit commit
        assert committed_offsets(mesh.bootstrap, group, topic)[1] == 57

        # ---- bad requests -------------------------------------------------------------
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        assert failing(lambda: read(partition=-1, to_offset=1))[:2] == (invalid, "INVALID_FIELD")
        assert failing(lambda: read(partition=1, from_offset=5, to_offset=4))[2] == {
            "field": "to_offset"
        }
        assert failing(lambda: read(partition=1, to_offset=1, max_bytes=1 << 30))[2] == {
            "field": "max_bytes"
        }
        unknown = failing(lambda: read(partition=1, to_offset=1, format=9))
        assert unknown[:2] == (invalid, "INVALID_FIELD") and unknown[2]["field"] == "format"
        assert failing(lambda: read(partition=1, to_offset=ends[1] + 1))[:2] == (
            grpc.StatusCode.OUT_OF_RANGE,
            "OFFSET_OUT_OF_RANGE",
        )
        code, reason, metadata = failing(lambda: read(partition=PARTITIONS + 3, to_offset=1))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_NOT_HELD")
        assert metadata["partition"] == str(PARTITIONS + 3)
        assert failing(lambda: read(group="not-mine", partition=1, to_offset=1))[:2] == (
            grpc.StatusCode.NOT_FOUND,
            "GROUP_NOT_SERVED",
        )
        assert failing(
            lambda: stub.CommitOffsets(
                stream_pb2.CommitOffsetsRequest(client_id="spark", group=group), timeout=5
            )
        )[:2] == (invalid, "INVALID_FIELD")
        not_open = stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=1))
        code, reason, metadata = failing(lambda: list(stub.Stream(iter([not_open]), timeout=5)))
        assert (code, reason, metadata["field"]) == (invalid, "INVALID_FIELD", "open")
        stale_ack = stream_pb2.RecordAck(
            topic=topic, partition=1, offset=0, lease_epoch=epochs[1] - 1
        )
        code, reason, metadata = failing(
            lambda: stub.Ack(
                stream_pb2.AckRequest(client_id="app", group=group, acks=[stale_ack]), timeout=5
            )
        )
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_EPOCH_STALE")
        assert metadata["current_epoch"] == str(epochs[1])
