"""Blocking long polls (Consul's blocking queries) from asyncio code, on a daemon thread of
their own per call.

``asyncio.to_thread`` runs a call on the loop's default executor, and ``asyncio.run()``
joins that executor's threads before it returns: a service stopping while a blocking query
waited stopped only when Consul answered (up to the query's wait: 5 s for the leader watch,
30 s for discovery). A long poll's answer is worthless once its caller is gone, so nothing
needs to wait for it: the thread is a daemon, its answer is dropped when the caller was
cancelled or the loop has closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def long_poll(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a daemon thread; cancelling the caller abandons it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, whatever it is
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: the caller is gone
            loop.call_soon_threadsafe(_settle, future, result, error)

    threading.Thread(target=run, name="ds-long-poll", daemon=True).start()
    return await future
