"""The shared polling helpers: what they return, and what a timeout says."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import wait_for, wait_for_async


def test_wait_for_returns_the_first_truthy_answer() -> None:
    answers = iter([None, 0, "ready"])
    assert wait_for(lambda: next(answers), 5, "an answer", every=0) == "ready"


def test_a_timeout_names_what_was_awaited_and_its_detail() -> None:
    with pytest.raises(AssertionError, match="waiting for the job:\nlast log line"):
        wait_for(lambda: False, 0, "the job", detail=lambda: "last log line")


def test_wait_for_async_lets_the_loop_run_until_the_check_holds() -> None:
    async def body() -> int:
        count = itertools.count()
        seen: list[int] = []

        async def tick() -> None:
            while True:
                seen.append(next(count))
                await asyncio.sleep(0)

        ticker = asyncio.get_running_loop().create_task(tick())
        try:
            return await wait_for_async(lambda: len(seen) >= 3 and len(seen), 5, "3 ticks", 0)
        finally:
            ticker.cancel()

    assert asyncio.run(body()) >= 3


def test_wait_for_async_times_out_naming_what_was_awaited() -> None:
    with pytest.raises(AssertionError, match="waiting for nothing"):
        asyncio.run(wait_for_async(lambda: False, 0, "nothing"))
