"""No work while idle (issue 34): the redelivery, commit and backpressure loops sleep until
a deadline they know of, or until an event gives them one; they no longer look at their
state on a fixed short tick.

The pure waits (``idle_waits.py``) are held by properties; the loops run on a real
PartitionTable and LeaseKeeper (Kafka faked at its edge, as in ``stream_harness``) and are
counted: how many rounds each made while nothing happened, and that the event or deadline
that matters still wakes them. No wall-clock time is asserted: a loop given a moment makes
no round at all when idle, and the waits for what must happen are bounded generously.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.acks import NO_LIMIT
from services.consumer_sidecar.backpressure_watch import watch_backpressure
from services.consumer_sidecar.idle_waits import (
    EXTERNAL_SWEEP_SECONDS,
    REDELIVERY_CHECK_SECONDS,
    commit_wait,
    external_sweep_interval,
    redelivery_wait,
)
from services.consumer_sidecar.partitions import Redelivery
from services.consumer_sidecar.settings import SidecarSettings
from services.consumer_sidecar.wakeup import Wakeup, bring_forward
from services.runtime.topic_partition import TP
from tests.unit.sidecar.stream_harness import TOPIC, Sidecar

IDLE_LOOK = 1.2  # longer than every tick the loops had (0.5 s and 1 s)
times = st.floats(0, 1e6)


@given(times, times)
def test_redelivery_sleeps_towards_the_next_deadline_looking_again_at_least_every_check(
    deadline: float, now: float
) -> None:
    wait = redelivery_wait(deadline, now)
    assert wait is not None
    assert 0 <= wait <= REDELIVERY_CHECK_SECONDS
    assert wait <= max(0.0, deadline - now)


@given(times)
def test_redelivery_with_nothing_in_flight_sleeps_until_woken(now: float) -> None:
    assert redelivery_wait(math.inf, now) is None


@given(st.booleans(), st.floats(0.01, 60), st.one_of(st.just(math.inf), times), times)
def test_commit_wait(pending: bool, interval: float, deadline: float, now: float) -> None:
    wait = commit_wait(pending, interval, deadline, now)
    if not pending and math.isinf(deadline):
        assert wait is None  # idle: until an ack, a renewal or a commit asked for
        return
    assert wait is not None and wait >= 0
    if pending:
        assert wait <= interval
    if not math.isinf(deadline):
        assert wait <= max(0.0, deadline - now)  # never past a lease's local deadline


def counting(fn: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fn(*args, **kwargs)

    return counted


def test_a_wakeup_set_from_another_thread_wakes_the_waiting_task() -> None:
    async def main() -> None:
        wake = Wakeup()
        wake.set()  # before bind: dropped (the task looks at the state after binding)
        assert not wake.is_set()
        wake.bind(asyncio.get_running_loop())
        assert not await wake.wait(0.01)
        threading.Timer(0.05, wake.set).start()
        assert await wake.wait(30)
        wake.clear()
        wake.set()  # on the loop's own thread: set at once
        assert wake.is_set()

    asyncio.run(main())


def test_bring_forward_only_ever_moves_a_running_wait_earlier() -> None:
    async def main() -> None:
        assert not bring_forward(None, 1.0)  # no wait: the caller wakes its task instead
        now = asyncio.get_running_loop().time()
        async with asyncio.timeout(None) as wait:
            assert bring_forward(wait, now + 60) and wait.when() == now + 60  # none had one
            assert bring_forward(wait, now + 90) and wait.when() == now + 60  # never later
            assert bring_forward(wait, now + 30) and wait.when() == now + 30
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0) as expired:
                await asyncio.sleep(1)
        assert not bring_forward(expired, now + 60)  # its task is looking already

    asyncio.run(main())


def test_the_table_says_when_records_go_in_flight_and_their_earliest_deadline() -> None:
    sidecar = Sidecar()
    table = sidecar.table
    signals: list[int] = []
    table.on_in_flight = lambda: signals.append(1)
    sidecar.hold(0)
    assert table.next_deadline() == math.inf
    sidecar.buffer(0, range(5))
    before = table.clock()
    assert table.take(10, 1 << 20)
    assert signals == [1]
    deadline = table.next_deadline()
    assert before + table.redelivery.visibility <= deadline < math.inf
    assert not table.take(10, 1 << 20)  # nothing handed out: no signal
    assert signals == [1]


def test_an_idle_redelivery_loop_makes_no_round_until_a_delivery_then_expires_it() -> None:
    async def main() -> None:
        sidecar = Sidecar()
        redeliverer, table = sidecar.keeper.redeliverer, sidecar.table
        table.redelivery = Redelivery(visibility=0.2, max_deliveries=NO_LIMIT)
        rounds: list[int] = []
        redeliverer.expire_deliveries = counting(redeliverer.expire_deliveries, rounds)  # type: ignore[method-assign]
        sidecar.hold(0)
        sidecar.buffer(0, range(3))
        loop = asyncio.create_task(redeliverer.redelivery_loop())
        try:
            await asyncio.sleep(IDLE_LOOK)
            assert rounds == []  # before: a round every 0.5 s
            assert len(table.take(10, 1 << 20)) == 1  # in flight until 0.2 s from now
            for _ in range(300):  # the deadline wakes the loop; records come due
                if table.get(TP(TOPIC, 0)).acks.due:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.1)
            assert table.get(TP(TOPIC, 0)).acks.due == 3  # type: ignore[union-attr]
            assert rounds
        finally:
            loop.cancel()

    asyncio.run(main())


def test_an_idle_commit_loop_makes_no_round_until_an_ack_or_a_renewal() -> None:
    async def main() -> None:
        sidecar = Sidecar()
        committer = sidecar.keeper.committer
        rounds: list[int] = []
        committer.commit_all = counting(committer.commit_all, rounds)  # type: ignore[method-assign]
        loop = asyncio.create_task(committer.commit_loop())
        try:
            await asyncio.sleep(IDLE_LOOK)
            assert rounds == []  # before: a round every second
            committer.request_commit()
            for _ in range(300):
                if rounds:
                    break
                await asyncio.sleep(0.01)
            assert rounds == [1]
        finally:
            loop.cancel()

    asyncio.run(main())


def test_an_ack_committed_by_its_own_answer_does_not_wake_the_idle_commit_loop() -> None:
    """Commit on ack: an ack's answer (``commit_acked``) commits it; the idle commit loop
    is not woken to commit it too (before: a second round per ack, a loop wake and a scan
    of the table at every batch; issue 34). It looks once within the commit interval, so
    an ack whose own commit failed is still committed by the loop."""

    async def main() -> None:
        sidecar = Sidecar()
        committer = sidecar.keeper.committer
        committer.commit_interval = 0.3
        loop_rounds: list[int] = []
        commit_all = committer.commit_all
        loop = asyncio.create_task(committer.commit_loop())
        try:
            await asyncio.sleep(0.05)  # the loop is idle
            committer.commit_all = counting(commit_all, loop_rounds)  # type: ignore[method-assign]
            part = sidecar.hold(0)
            sidecar.buffer(0, range(3))
            (taken,) = sidecar.table.take(10, 1 << 20)
            for offset in range(taken.first_offset, taken.last_offset + 1):
                assert sidecar.serving.ack(record_ack(offset), "c1") is None
                committer.commit_all = commit_all  # type: ignore[method-assign]
                touched = {part.tp: (part, part.acks.version)}
                assert await sidecar.serving.commit_acked(touched) == {}
                committer.commit_all = counting(commit_all, loop_rounds)  # type: ignore[method-assign]
                await asyncio.sleep(0.01)
            assert part.committed == 3
            assert loop_rounds == []  # not a round per ack
            for _ in range(300):  # one look within the interval
                if loop_rounds:
                    break
                await asyncio.sleep(0.01)
            assert loop_rounds == [1]
            await asyncio.sleep(0.5)
            assert loop_rounds == [1]  # then idle again
        finally:
            loop.cancel()

    asyncio.run(main())


def record_ack(offset: int) -> stream_pb2.RecordAck:
    return stream_pb2.RecordAck(topic=TOPIC, partition=0, offset=offset, lease_epoch=1)


class SuspendingFetcher:
    """The fetch thread's suspension of a lapsed lease, recorded."""

    def __init__(self) -> None:
        self.suspended: list[TP] = []

    def suspend(self, tp: TP) -> None:
        self.suspended.append(tp)


def test_a_renewal_gives_the_idle_commit_loop_the_deadline_it_suspends_the_lease_at() -> None:
    async def main() -> None:
        sidecar = Sidecar()
        keeper = sidecar.keeper
        suspending = SuspendingFetcher()
        sidecar.fetcher.suspend = suspending.suspend  # type: ignore[attr-defined]
        part = sidecar.hold(0, ttl=3600)
        part.confirmed = False  # a fresh grant: no deadline to pass yet
        loop = asyncio.create_task(keeper.committer.commit_loop())
        try:
            await asyncio.sleep(0.1)  # the loop sleeps: nothing to commit, no deadline
            part.deadline = 0.0
            keeper.renew(part.tp, part.epoch, keeper.clock() + 0.2)  # live for 0.2 s
            assert part.live(keeper.clock())
            for _ in range(300):
                if suspending.suspended:
                    break
                await asyncio.sleep(0.1)
            assert suspending.suspended == [part.tp]  # fenced once its deadline passed
            assert part.suspended_at is not None
        finally:
            loop.cancel()

    asyncio.run(main())


class Faults:
    def __init__(self) -> None:
        self.reports: list[list[TP]] = []

    def backpressure(self, paused: list[TP]) -> None:
        self.reports.append(list(paused))


def test_the_backpressure_watch_sleeps_until_the_fetch_thread_holds_back() -> None:
    async def main() -> None:
        sidecar = Sidecar()
        table = sidecar.table
        part = sidecar.hold(0)
        faults = Faults()
        watch = asyncio.create_task(watch_backpressure(table, faults))  # type: ignore[arg-type]
        try:
            await asyncio.sleep(IDLE_LOOK)
            assert faults.reports == [[]]  # one look at the start, none since
            part.paused = True  # as the fetch thread pauses past the cap, then says so
            threading.Thread(target=table.on_backpressure).start()
            for _ in range(300):
                if len(faults.reports) > 1:
                    break
                await asyncio.sleep(0.01)
            assert faults.reports[1] == [part.tp]
        finally:
            watch.cancel()

    asyncio.run(main())


@given(st.floats(0.01, 60))
def test_the_external_sweep_is_never_shorter_than_its_floor_nor_the_setting(
    interval: float,
) -> None:
    sweep = external_sweep_interval(interval)
    assert sweep >= EXTERNAL_SWEEP_SECONDS
    assert sweep >= interval


def test_an_idle_sidecars_external_check_makes_no_round_on_the_default_interval() -> None:
    """Issue 34: the background read-back of every held partition (an OffsetFetch on the
    commit thread) ran every 0.5 s, the default ``external_check_interval_seconds``."""

    async def main() -> None:
        sidecar = Sidecar()
        committer = sidecar.keeper.committer
        rounds: list[int] = []
        committer.check_external = counting(committer.check_external, rounds)  # type: ignore[method-assign]
        sidecar.fetcher.external_changes = "follow"  # type: ignore[attr-defined]
        sidecar.hold(0)
        interval = SidecarSettings.model_fields["external_check_interval_seconds"].default
        loop = asyncio.create_task(committer.external_check_loop(external_sweep_interval(interval)))
        try:
            await asyncio.sleep(0.9)  # short of the sweep, past the old 0.5 s
            assert rounds == []  # before: one round
            for _ in range(300):  # and the sweep still comes
                if rounds:
                    break
                await asyncio.sleep(0.1)
            assert rounds
        finally:
            loop.cancel()

    asyncio.run(main())


def test_acks_that_come_during_a_commit_share_the_next_one_instead_of_a_commit_each() -> None:
    """Commit on ack, acks coming faster than a commit's round trip: each ack's answer
    waits for a commit covering it, and one commit covers every ack applied before it. A
    waiter whose acks a commit made while it waited for the lock already covers returns
    without a commit of its own. Before, each waiter committed what came meanwhile: a
    commit per ack message queued behind the lock, a queue that grows while acks keep
    coming (found with commits answered from the event loop's polls, 2 ms and more each:
    at 1,000 records/s records waited up to a second in the sidecar). Kafka's answers
    are the test's to give: one for every four acks."""

    async def main() -> None:
        sidecar = Sidecar()
        committer = sidecar.keeper.committer
        kafka = committer.commits
        made: list[list[int]] = []
        answered: asyncio.Queue[None] = asyncio.Queue()
        plain = kafka.commit_async

        async def round_trip(requests: list[Any]) -> list[Any]:
            made.append([r.offset for r in requests])
            await answered.get()
            return await plain(requests)

        kafka.commit_async = round_trip  # type: ignore[method-assign]
        part = sidecar.hold(0)
        sidecar.buffer(0, range(40))
        (taken,) = sidecar.table.take(40, 1 << 20)
        answers = []
        for n, offset in enumerate(range(taken.first_offset, taken.last_offset + 1), 1):
            assert sidecar.serving.ack(record_ack(offset), "c1") is None
            touched = {part.tp: (part, part.acks.version)}
            answers.append(asyncio.create_task(sidecar.serving.commit_acked(touched)))
            for _ in range(5):
                await asyncio.sleep(0)
            if n % 4 == 0:
                answered.put_nowait(None)
        waiting = sum(1 for a in answers if not a.done())
        for _ in range(40):
            answered.put_nowait(None)
        assert await asyncio.gather(*answers) == [{}] * 40
        assert part.committed == 40
        # After 10 answers from Kafka: the acks since the last commit wait (4 to 8), not
        # one per commit made so far.
        assert waiting <= 8, f"{waiting} acks wait for their answer; commits: {made}"

    asyncio.run(main())
