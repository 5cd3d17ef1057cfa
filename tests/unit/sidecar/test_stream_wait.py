"""An idle Stream sleeps until records can be taken (issue 34).

Every Stream waited on one event shared with the other readers, which each cleared before
looking, so each also looked again every 0.5 s (an attached, idle client cost its sidecar
two rounds a second). Each Stream now waits on an event of its own (``DataSignal.add_waiter``),
set when records are buffered or come due again. Counted here, on the real servicer over
a real Serving, table and keeper (``stream_harness``): the rounds an idle stream makes
(``take`` calls), and that records buffered, or given back by another stream, still reach
every stream waiting. No wall-clock time is asserted.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from dataservice.sidecar.v1 import stream_pb2_grpc
from services.consumer_sidecar.serving import Serving
from tests.unit.sidecar.stream_harness import Requests, Sidecar, opening, run

Stub = stream_pb2_grpc.StreamServiceStub
IDLE_LOOK = 1.2  # more than two of the old 0.5 s rounds


def count_takes(serving: Serving, rounds: list[int]) -> None:
    take = serving.take

    def counted(*args: Any) -> Any:
        rounds.append(1)
        return take(*args)

    serving.take = counted  # type: ignore[method-assign]


async def read_offsets(call: Any, count: int) -> list[int]:
    got: list[int] = []
    while len(got) < count:
        got += [r.offset for r in (await call.read()).batch.records]
    return got


def test_idle_streams_make_no_rounds_and_each_wakes_for_records() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.hold(1)
        rounds: list[int] = []
        count_takes(sc.serving, rounds)
        # Credit for 3 records each: one stream cannot take what the other must get.
        calls = [stub.Stream(Requests(opening(records=3, client_id=f"app-{i}"))) for i in (1, 2)]
        while len(rounds) < 2:  # each stream looked once and found nothing
            await asyncio.sleep(0.05)
        await asyncio.sleep(IDLE_LOOK)
        assert len(rounds) == 2  # before: two more rounds a stream
        sc.buffer(0, range(3))
        sc.buffer(1, range(3))
        got = await asyncio.wait_for(asyncio.gather(*(read_offsets(c, 3) for c in calls)), 15)
        assert sorted(len(g) for g in got) == [3, 3]
        for call in calls:
            call.cancel()

    run(body)


def test_records_a_closed_stream_gives_back_wake_a_waiting_stream() -> None:
    async def body(stub: Stub, sc: Sidecar) -> None:
        sc.hold(0)
        sc.buffer(0, range(5))
        first = stub.Stream(Requests(opening(records=5, client_id="app-1")))
        assert await read_offsets(first, 5) == list(range(5))
        second = stub.Stream(Requests(opening(records=5, client_id="app-2")))
        rounds: list[int] = []
        count_takes(sc.serving, rounds)
        await asyncio.sleep(IDLE_LOOK)  # the second stream waits, nothing to take
        first.cancel()  # 0..4 un-acked come due again
        again = await asyncio.wait_for(read_offsets(second, 5), 15)
        assert again == list(range(5))
        second.cancel()

    run(body)


def test_notifies_before_the_loop_ran_go_as_one_wake_up_and_none_is_lost() -> None:
    """The fetch thread notifies per buffered batch: the notifies made before the loop ran
    the last one's callback are one callback (one byte on the loop's self-pipe); a notify
    after it ran schedules anew, so records buffered then still wake the waiters."""
    from services.consumer_sidecar.serving import DataSignal

    async def main() -> tuple[int, int, bool]:
        loop = asyncio.get_running_loop()
        scheduled: list[int] = []
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any) -> Any:
            if getattr(callback, "__self__", None) is signal:  # the signal's, no other
                scheduled.append(1)
            return call_soon_threadsafe(callback, *args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        signal = DataSignal()
        signal.bind_loop(loop)
        waiter = asyncio.Event()
        signal.add_waiter(waiter)

        def notify_from_a_thread(times: int) -> None:
            # Joined on the loop's thread: the loop runs none of the callbacks meanwhile.
            def notify() -> None:
                for _ in range(times):
                    signal.notify()

            thread = threading.Thread(target=notify)
            thread.start()
            thread.join()

        notify_from_a_thread(5)
        await asyncio.wait_for(waiter.wait(), 10)
        first = len(scheduled)
        waiter.clear()
        notify_from_a_thread(1)  # after the callback ran: scheduled anew
        await asyncio.wait_for(waiter.wait(), 10)
        return first, len(scheduled), waiter.is_set()

    first, total, woken = asyncio.run(main())
    assert (first, total, woken) == (1, 2, True)
