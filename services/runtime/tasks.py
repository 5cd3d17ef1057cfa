"""Background tasks an object owns: the one place their bookkeeping is written.

Each service's long-lived objects (the sidecar and notifier apps, the sidecar's session and
dead-letter writer, the assigner's fenced step-downs) start asyncio tasks they must keep a
reference to (the loop holds only a weak one), forget once done, and cancel when they close.
A task that fails is logged when it fails, under the owner's own message, not when (or if)
someone awaits it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class TaskSet:
    """The running tasks of one owner. ``failed`` is the message a failure is logged with."""

    def __init__(self, failed: str = "background task failed") -> None:
        self._failed = failed
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Start ``coro`` on the running loop; kept until it is done."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error(self._failed, task=task.get_name(), error=repr(error))

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for each to end."""
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))
