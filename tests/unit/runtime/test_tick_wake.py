"""The tick loop's timing (tick_wake.py): when it ticks unless poked (pure), and that a
poke ends its sleep while an earlier poke does not."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from services.runtime.tick_wake import IDLE_TICK_SECONDS, TickWake, next_tick

times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
dues = st.one_of(times, st.just(float("inf")), st.just(float("-inf")))
gaps = st.floats(min_value=0.01, max_value=5.0)


@given(times, dues, gaps)
def test_the_next_tick_is_the_deadline_within_the_gap_and_the_idle_limit(
    ticked: float, due: float, gap: float
) -> None:
    at = next_tick(ticked, due, gap)
    assert ticked + gap <= at <= ticked + max(IDLE_TICK_SECONDS, gap)
    if ticked + gap <= due <= ticked + IDLE_TICK_SECONDS:
        assert at == due


def test_a_poke_ends_the_sleep_and_one_before_it_does_not() -> None:
    async def scenario() -> None:
        wake = TickWake(time.monotonic)
        wake.poke()  # during the tick: the tick's deadline already counts it
        now = time.monotonic()
        sleeping = asyncio.create_task(wake.sleep(now, now + 3600, 0.0))
        await asyncio.sleep(0.05)
        assert not sleeping.done()
        wake.poke()
        lag = await asyncio.wait_for(sleeping, 60)  # not the hour: the poke ended it
        assert lag >= 0.0

    asyncio.run(scenario())


def test_an_unpoked_sleep_ends_at_its_deadline() -> None:
    async def scenario() -> None:
        wake = TickWake(time.monotonic)
        now = time.monotonic()
        lag = await asyncio.wait_for(wake.sleep(now, now + 0.01, 0.0), 60)
        assert time.monotonic() >= now + 0.01
        assert lag >= 0.0

    asyncio.run(scenario())


def test_a_poke_within_the_gap_waits_for_the_gap() -> None:
    async def scenario() -> None:
        wake = TickWake(time.monotonic)
        now = time.monotonic()
        sleeping = asyncio.create_task(wake.sleep(now, now + 3600, 0.2))
        await asyncio.sleep(0)
        wake.poke()
        await asyncio.wait_for(sleeping, 60)
        assert time.monotonic() >= now + 0.2  # events within the gap share one tick

    asyncio.run(scenario())
