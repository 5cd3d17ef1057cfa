"""A Stream's answers are bounded when its client does not read them (issue 37, finding
11): every acks and nacks message the client sends is answered on the stream, so a client
that sends without reading would grow the stream's answer queue without limit. Past
``MAX_STREAM_RESULTS`` answers waiting (queued or being committed), the sidecar stops
reading the client's messages until the client has read some: its sends then wait on
HTTP/2 flow control, on its side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.rpc import StreamServicer
from services.consumer_sidecar.stream_flow import MAX_STREAM_RESULTS, Credit, StreamState
from tests.unit.sidecar.stream_harness import FakeReaders, Sidecar

SENT = 3 * MAX_STREAM_RESULTS


def test_a_client_that_never_reads_cannot_grow_the_answers() -> None:
    async def main() -> None:
        sidecar = Sidecar()
        sidecar.data.bind_loop(asyncio.get_running_loop())
        servicer = StreamServicer(sidecar.serving, FakeReaders())  # type: ignore[arg-type]
        state = StreamState(credit=Credit(), auto_ack=False, columns=False, client_id="c1")
        taken = 0

        async def never_reading_client() -> AsyncIterator[stream_pb2.StreamRequest]:
            nonlocal taken
            for _ in range(SENT):
                taken += 1
                yield stream_pb2.StreamRequest(nacks=stream_pb2.StreamNacks())

        reader = asyncio.create_task(servicer.streams.read_requests(never_reading_client(), state))
        for _ in range(200):  # let the reader take all it will take
            await asyncio.sleep(0)
        peak = len(state.results)
        print(
            f"{SENT} nacks sent, none of the answers read: {taken} taken, "
            f"{peak} answers queued (bound {MAX_STREAM_RESULTS})"
        )
        assert peak <= MAX_STREAM_RESULTS and taken <= MAX_STREAM_RESULTS + 1
        assert not reader.done()
        # the client reads its answers: the sidecar reads on, to the end
        while not reader.done():
            while state.results:
                state.results.popleft()
            state.drained()
            await asyncio.sleep(0)
        assert taken == SENT and state.ended and state.error is None

    asyncio.run(main())
