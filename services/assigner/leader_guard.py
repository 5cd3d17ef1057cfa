"""Followers refuse the assigner's APIs and name the leader (ARCHITECTURE §3 "Leaders").

While this replica is not the leader, every call to ``AssignerService``, ``BindingService``
and ``AdminService`` fails with ``FAILED_PRECONDITION`` / ``NOT_LEADER`` and trailing
metadata ``ds-leader`` = the leader's address (empty while none is known); health and
reflection stay available. A leader that loses its lock ends its open streams (Session,
WatchBinding) the same way, so sidecars and clients move to the new leader at once instead
of talking to a replica that no longer decides anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio

from dsclient.reasons import LEADER_METADATA_KEY, DsError, Reason
from services.assigner.leadership import Leadership
from services.runtime.error_interceptor import abort
from services.runtime.handlers import Behavior, WrappingInterceptor

GUARDED_SERVICES = (
    "dataservice.assigner.v1.AssignerService",
    "dataservice.assigner.v1.BindingService",
    "dataservice.assigner.v1.AdminService",
)

Context = grpc.aio.ServicerContext[Any, Any]


def is_guarded(method: str) -> bool:
    """``/package.Service/Method`` → whether only the leader may answer it."""
    service = method.lstrip("/").split("/", 1)[0]
    return service in GUARDED_SERVICES


def not_leader(leader: str | None) -> DsError:
    """The error a follower answers with."""
    where = f"the leader is {leader}" if leader else "no leader is known yet"
    return DsError(
        Reason.NOT_LEADER,
        f"this assigner is not the leader; {where}",
        metadata={"leader": leader or ""},
        trailing={LEADER_METADATA_KEY: leader or ""},
    )


def rejection(leadership: Leadership, method: str) -> DsError | None:
    """The error for ``method`` on this replica right now, or None if it may proceed."""
    if not is_guarded(method) or leadership.is_leader:
        return None
    return not_leader(leadership.leader_address)


class LeaderGuard(WrappingInterceptor):
    """``leadership`` is the object itself or a function returning the current one (the
    server is built before the app knows its port, i.e. before it can campaign)."""

    def __init__(self, leadership: Leadership | Callable[[], Leadership]) -> None:
        self._leadership = leadership

    @property
    def leadership(self) -> Leadership:
        current = self._leadership
        return current() if callable(current) else current

    def covers(self, method: str) -> bool:
        return is_guarded(method)

    def wrap(
        self, method: str, behavior: Behavior, request_streaming: bool, response_streaming: bool
    ) -> Behavior:
        return (self._stream if response_streaming else self._unary)(behavior, method)

    def _unary(self, behavior: Behavior, method: str) -> Behavior:
        async def guarded(request: Any, context: Context) -> Any:
            if (err := rejection(self.leadership, method)) is not None:
                await abort(context, err)
            return await behavior(request, context)

        return guarded

    def _stream(self, behavior: Behavior, method: str) -> Behavior:
        async def guarded(request: Any, context: Context) -> AsyncIterator[Any]:
            if (err := rejection(self.leadership, method)) is not None:
                await abort(context, err)
            # The term this stream was opened in: when it ends, so does the stream.
            lost = self.leadership.term_lost()
            async for response in _until(behavior(request, context), lost):
                yield response
            if lost.is_set():
                await abort(context, not_leader(self.leadership.leader_address))

        return guarded


async def _until(stream: AsyncIterator[Any], stop: asyncio.Event) -> AsyncIterator[Any]:
    """Items of ``stream`` until it ends or ``stop`` is set (then it is closed).

    One waiter per stream, not per item: a task and an ``asyncio.wait`` per message cost a
    Session about a tenth of the assigner's CPU. When ``stop`` is set while the next item
    is awaited, the task awaiting it is cancelled there (inside ``stream``, which sees the
    cancellation at its own await, as it did when that await was a task of its own); set
    while an item is out with the caller (gRPC sending it), the stream ends before the next
    one is asked for. gRPC's own cancellation of the call passes through unchanged."""
    iterator = stream.__aiter__()
    awaiting: asyncio.Task[Any] | None = None  # the task inside anext(iterator), if any
    stopped_it = False

    def on_stop(_: asyncio.Future[Any]) -> None:
        nonlocal stopped_it
        if awaiting is not None and not stopped_it:
            stopped_it = True
            awaiting.cancel()

    waiter = asyncio.ensure_future(stop.wait())
    waiter.add_done_callback(on_stop)
    try:
        while not stop.is_set():
            awaiting = asyncio.current_task()
            try:
                value = await anext(iterator)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not stopped_it:
                    raise
                assert awaiting is not None
                awaiting.uncancel()  # ours, not the call's: the guard answers NOT_LEADER
                return
            finally:
                awaiting = None
            yield value
    finally:
        waiter.remove_done_callback(on_stop)
        waiter.cancel()
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
