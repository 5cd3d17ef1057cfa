"""A wake-up for a task of the event loop that any thread may give (issue 34).

The sidecar's background loops (redelivery, commits, backpressure) used to look at their
state on a fixed short tick whether or not anything had changed, so an idle sidecar woke
several times a second for nothing. Each now sleeps until a deadline it knows of, or, with
none, until what could give it one happens: a delivery, an ack, a partition paused. Those
happen on the event loop or on the fetch thread, hence this.

Usage: the waiting task calls :meth:`Wakeup.bind` once on the loop, then in its loop
:meth:`clear`, looks at the state, and :meth:`wait`\\ s (with a timeout, or none). A
:meth:`set` before :meth:`bind` is dropped: the task looks at the state after binding.
"""

from __future__ import annotations

import asyncio
import threading


class Wakeup:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the waiting task runs on; call on that loop's thread."""
        self._loop = loop
        self._thread = threading.get_ident()

    def set(self) -> None:
        """Wake the waiting task, from any thread. Cheap when already set (as it stays while
        the task is busy): a hot path may call it for every batch."""
        if self._event.is_set() or self._loop is None:
            return
        if threading.get_ident() == self._thread:
            self._event.set()
        else:
            self._loop.call_soon_threadsafe(self._event.set)

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None) -> bool:
        """Until set or ``timeout`` seconds passed (None: no timeout); True if set."""
        if timeout is None:
            await self._event.wait()
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        return True


def bring_forward(timeout: asyncio.Timeout | None, when: float) -> bool:
    """Make a running ``asyncio.timeout`` end by ``when`` (loop time) at the latest, instead
    of waking its task now: the task looks once then (issue 34: a wake per message that
    changed nothing it could act on). False if there is none or it already expired: its task
    is about to look anyway."""
    if timeout is None or timeout.expired():
        return False
    deadline = timeout.when()
    if deadline is None or deadline > when:
        timeout.reschedule(when)
    return True
