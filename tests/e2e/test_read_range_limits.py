"""Concurrent ReadRange streams per sidecar are capped, and each open stream's memory (its
consumer's prefetch and one chunk) is reserved from the sidecar's buffer cap (issue 18,
item 9), on a real sidecar and a real Kafka broker: with ``read_range_max_streams`` = 3, a
stream asking for chunks bigger than what the open streams left of the budget is
RESOURCE_EXHAUSTED / TOO_MANY_RANGE_READS (``limit`` ``bytes``), a fourth stream is refused
the same way (``limit`` ``streams``), and a cancelled stream frees its slot at once. Every
record of every partition is read exactly once in the end."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from tests.support.mesh import Mesh
from tests.support.offsets import end_offsets
from tests.support.producing import produce
from tests.support.sidecar_rpcs import failing, retry_not_ready

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

PARTITIONS = 3
PER_PARTITION = 1500
VALUE = b"x" * 10_000  # 15 MB a partition: far more than a stream's flow-control window
MIB = 1024 * 1024


def test_read_range_streams_are_capped_and_a_cancelled_one_frees_its_slot(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    expected = produce(
        mesh.bootstrap,
        topic,
        range(PARTITIONS * PER_PARTITION),
        partitions=PARTITIONS,
        value=lambda _seq: VALUE,
        linger_ms=20,
        flush_timeout=60,
    )
    ends = end_offsets(mesh.bootstrap, topic, PARTITIONS)
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(
        group, assigner, "sidecar-ranges", env={"DS_READ_RANGE_MAX_STREAMS": "3"}
    )
    sidecar.wait_serving()
    read: dict[int, list[int]] = defaultdict(list)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)

        def open_range(partition: int, max_bytes: int = 64 * 1024) -> Any:
            request = stream_pb2.ReadRangeRequest(
                client_id="reader", group=group, topic=topic, partition=partition,
                from_offset=0, to_offset=ends[partition], max_bytes=max_bytes,
            )  # fmt: skip
            return stub.ReadRange(request, timeout=60)

        def first_chunk(partition: int) -> tuple[Any, stream_pb2.ReadRangeResponse]:
            def attempt() -> tuple[Any, stream_pb2.ReadRangeResponse]:
                call = open_range(partition)
                return call, next(call)

            return retry_not_ready(attempt)

        def keys(response: stream_pb2.ReadRangeResponse) -> list[int]:
            return [int(r.key.decode()) for r in response.records]

        def refusal(partition: int, max_bytes: int) -> tuple[str, str, dict[str, str]]:
            code, reason, meta = failing(lambda: next(open_range(partition, max_bytes)))
            print(f"refused: {code.name} {reason} {meta}")
            assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_RANGE_READS")
            return code.name, meta["limit"], meta

        def drain(call: Any, partition: int) -> None:
            for response in call:
                read[partition].extend(keys(response))

        a, _ = first_chunk(0)  # what a is given is read again whole by d below
        b, b_first = first_chunk(1)
        read[1].extend(keys(b_first))
        # Two streams hold 2 x (4 MiB prefetch + 64 KiB chunk) of ReadRange's 32 MiB (half
        # the 64 MiB buffer cap): one asking for 24 MiB chunks (28 MiB) does not fit now.
        _, limit, meta = refusal(2, 24 * MIB)
        assert limit == "bytes" and int(meta["needed_bytes"]) == 28 * MIB
        assert int(meta["budget_bytes"]) == 32 * MIB and meta["open_streams"] == "2"
        c, c_first = first_chunk(2)
        read[2].extend(keys(c_first))
        _, limit, meta = refusal(0, 64 * 1024)
        assert limit == "streams" and meta["open_streams"] == meta["max_streams"] == "3"

        a.cancel()  # a cancelled stream gives its slot back
        cancelled_at = time.monotonic()
        while True:
            try:
                d, d_first = first_chunk(0)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                assert time.monotonic() < cancelled_at + 10, "the cancelled stream kept its slot"
                time.sleep(0.05)
        print(f"slot freed {time.monotonic() - cancelled_at:.2f} s after the cancel")
        read[0].extend(keys(d_first))
        for call, partition in ((b, 1), (c, 2), (d, 0)):
            drain(call, partition)

    got = sum(len(v) for v in read.values())
    lost = sum(len(set(expected[p]) - set(read[p])) for p in expected)
    duplicates = got - sum(len(set(v)) for v in read.values())
    print(
        f"read range limits: produced {PARTITIONS * PER_PARTITION}, read {got}, lost {lost}, "
        f"duplicates {duplicates}"
    )
    assert dict(read) == dict(expected), "records missing, duplicated or out of order"
