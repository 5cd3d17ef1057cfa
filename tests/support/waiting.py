"""Waiting in tests: poll a check until it answers, or fail saying what was awaited.

The one ``wait_for`` the suites share (it was defined in a dozen test modules, each with its
own sleep and message). Never a wall-clock assertion: the timeout only bounds how long a test
waits on a loaded machine before it says what did not happen."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    every: float = 0.2,
    *,
    tolerate: tuple[type[BaseException], ...] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """Call ``check()`` every ``every`` seconds until it returns something truthy, and return
    that; raise AssertionError naming ``what`` after ``timeout`` seconds (followed by
    ``detail()``, a log's tail say, where given). Exceptions of the types in ``tolerate``
    count as "not yet" (a service still starting, say)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(*tolerate):
            if result := check():
                return result
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout, what, detail))
        time.sleep(every)


async def wait_for_async(
    check: Callable[[], T | None], timeout: float, what: str, every: float = 0.02
) -> T:
    """:func:`wait_for` on a running event loop: sleeps with ``asyncio.sleep``, so the
    tasks that are to make ``check()`` true run meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        if result := check():
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(timeout, what, None))
        await asyncio.sleep(every)


def _timed_out(timeout: float, what: str, detail: Callable[[], str] | None) -> str:
    message = f"timed out after {timeout}s waiting for {what}"
    return message if detail is None else f"{message}:\n{detail()}"
