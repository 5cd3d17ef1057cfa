"""Blocking long polls (Consul's blocking queries) run where a stopping service does not
wait for them: asyncio.run() joins its default executor's threads at exit, so a query
started with asyncio.to_thread held every stop for up to its wait (5 s for the leader
watch, 30 s for discovery)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dsclient.long_poll import long_poll

ran_on: list[threading.Thread] = []


def _wait(event: threading.Event, seconds: float) -> str:
    ran_on.append(threading.current_thread())
    event.wait(seconds)
    return "answered"


def test_a_service_stops_without_waiting_for_a_long_poll_in_flight() -> None:
    release = threading.Event()
    ran_on.clear()

    async def service() -> None:
        task = asyncio.ensure_future(long_poll(_wait, release, 5.0))
        await asyncio.sleep(0.1)
        task.cancel()  # the service stops: its watch task is cancelled

    asyncio.run(service())
    # asyncio.run returned while the poll still waits: nobody joined its thread.
    (thread,) = ran_on
    still_polling = thread.is_alive()
    release.set()
    thread.join()
    assert still_polling, "asyncio.run waited for the long poll to answer"


def test_a_long_poll_returns_its_answer_and_raises_its_error() -> None:
    release = threading.Event()
    release.set()
    assert asyncio.run(long_poll(_wait, release, 1.0)) == "answered"

    def fail() -> None:
        raise ConnectionError("consul down")

    with pytest.raises(ConnectionError, match="consul down"):
        asyncio.run(long_poll(fail))


def test_an_answer_after_the_loop_closed_is_dropped_quietly() -> None:
    release = threading.Event()
    errors: list[BaseException] = []
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment]
    try:

        async def service() -> None:
            task = asyncio.ensure_future(long_poll(_wait, release, 5.0))
            await asyncio.sleep(0.05)
            task.cancel()

        asyncio.run(service())
        release.set()  # the poll answers after its loop is gone
        time.sleep(0.2)
    finally:
        threading.excepthook = threading.__excepthook__
    assert errors == []
