"""Concurrent ReadRange streams are capped per sidecar and their memory is reserved from the
buffer cap (issue 18, item 9): before, any caller could open any number of ReadRange
consumers, each with its own librdkafka prefetch, beside the buffer the operator sized."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
from hypothesis import given
from hypothesis import strategies as st

from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2_grpc
from services.consumer_sidecar.read_budget import ReadBudget
from services.consumer_sidecar.reader import Chunk, RangeSpec
from tests.support.waiting import wait_for_async
from tests.unit.sidecar.stream_harness import (
    TOPIC,
    FakeReaders,
    Sidecar,
    read_request,
    reason_of,
    run,
)

MIB = 1024 * 1024


def test_streams_and_bytes_are_both_limits_and_release_gives_back() -> None:
    budget = ReadBudget(max_streams=2, max_bytes=10 * MIB)
    assert budget.reserve(4 * MIB) is None
    refusal = budget.reserve(7 * MIB)
    assert refusal is not None and refusal.limit == "bytes"
    assert budget.reserve(6 * MIB) is None
    refusal = budget.reserve(1)
    assert refusal is not None and refusal.limit == "streams"
    budget.release(4 * MIB)
    assert (budget.streams, budget.reserved) == (1, 6 * MIB)
    assert budget.reserve(4 * MIB) is None


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=40))
def test_what_is_open_never_exceeds_either_limit(steps: list[tuple[bool, int]]) -> None:
    budget = ReadBudget(max_streams=3, max_bytes=20)
    open_: list[int] = []
    for opening, size in steps:
        if opening:
            refusal = budget.reserve(size)
            fits = len(open_) < 3 and sum(open_) + size <= 20
            assert (refusal is None) == fits
            if refusal is None:
                open_.append(size)
        elif open_:
            budget.release(open_.pop(0))
        assert (budget.streams, budget.reserved) == (len(open_), sum(open_))
        assert budget.streams <= 3 and budget.reserved <= 20


class HeldReaders(FakeReaders):
    """Each range hands out its first record, then waits until ``finish`` is set."""

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(8)
        self.finish = threading.Event()

    def open(self, spec: RangeSpec) -> Any:
        self.opened.append(spec)
        first = [True]

        def next_chunk() -> Chunk | None:
            if first[0]:
                first[0] = False
                record = common_pb2.Record(topic=TOPIC, offset=spec.from_offset)
                return Chunk([record], next_offset=spec.from_offset + 1)
            self.finish.wait(15)
            return Chunk([], next_offset=spec.to_offset)

        return SimpleNamespace(next_chunk=next_chunk, close=lambda: None)


def test_on_the_servicer_streams_are_capped_reserved_from_the_buffer_and_freed_on_cancel() -> None:
    readers = HeldReaders(prefetch_bytes=MIB)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        sc.hold(0)
        budget = sc.serving.read_budget  # the default: 4 streams, half the 64 MiB cap
        assert (budget.max_streams, budget.max_bytes) == (4, 32 * MIB)

        async def opened(**kw: Any) -> Any:
            call = stub.ReadRange(read_request(to_offset=100, max_bytes=MIB, **kw))
            await call.read()  # the first chunk: the stream is open
            return call

        async def refused(**kw: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
            call = stub.ReadRange(read_request(to_offset=100, **kw))
            try:
                await call.read()
            except grpc.aio.AioRpcError as err:
                return reason_of(err)
            raise AssertionError("the ReadRange was accepted")

        calls = [await opened(), await opened()]
        # Each holds its consumer's prefetch and one chunk, off the leased buffer's share.
        assert sc.table.reserved_bytes == 4 * MIB
        assert sc.table.leased_cap == 60 * MIB
        code, reason, meta = await refused(max_bytes=30 * MIB)  # needs 31 MiB: 35 > 32
        assert (code, reason, meta["limit"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TOO_MANY_RANGE_READS",
            "bytes",
        )
        assert (meta["needed_bytes"], meta["reserved_bytes"]) == (str(31 * MIB), str(4 * MIB))
        calls += [await opened(), await opened()]
        code, reason, meta = await refused(max_bytes=MIB)
        assert (code, reason, meta["limit"], meta["open_streams"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TOO_MANY_RANGE_READS",
            "streams",
            "4",
        )
        assert len(readers.opened) == 4  # a refused stream never opened a consumer

        calls.pop(0).cancel()  # a cancelled stream frees its slot and its bytes
        await wait_for_async(lambda: budget.streams == 3, 10, "3 streams open")
        assert sc.table.reserved_bytes == 6 * MIB
        calls.append(await opened())

        readers.finish.set()  # the others finish: everything is given back
        for call in calls:
            assert (await call.read()).next_offset == 100
            assert await call.read() is grpc.aio.EOF
        await wait_for_async(lambda: budget.streams == 0, 10, "no stream open")
        assert (budget.reserved, sc.table.reserved_bytes, sc.table.leased_cap) == (0, 0, 64 * MIB)

    run(body, readers)
