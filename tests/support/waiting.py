"""Waiting in tests: poll a check until it answers, or fail saying what was awaited.

The one ``wait_for`` the suites share (it was defined in a dozen test modules, each with its
own sleep and message). Never a wall-clock assertion: the timeout only bounds how long a test
waits on a loaded machine before it says what did not happen."""

from __future__ import annotations

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
) -> T:
    """Call ``check()`` every ``every`` seconds until it returns something truthy, and return
    that; raise AssertionError naming ``what`` after ``timeout`` seconds. Exceptions of the
    types in ``tolerate`` count as "not yet" (a service still starting, say)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(*tolerate):
            if result := check():
                return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
