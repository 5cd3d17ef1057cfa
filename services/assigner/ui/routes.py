"""The /ui routes on the HTTP endpoint: each runs its page's gathering on the assigner's
event loop (where the group state lives) and renders the result on the HTTP thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from dsclient.reasons import DsError, Reason
from services.assigner.ui import render
from services.assigner.ui.gather import UiData
from services.assigner.ui.model import Problem
from services.runtime.http import HttpResponse, Route

V = TypeVar("V")
HTML = "text/html; charset=utf-8"
PAGE_TIMEOUT_SECONDS = 10.0
_STATUS = {
    Reason.GROUP_NOT_FOUND: 404,
    Reason.INVALID_FIELD: 400,
    Reason.KAFKA_UNAVAILABLE: 503,
    Reason.SERVICE_NOT_READY: 503,
}


class UiRoutes:
    """The pages; until :attr:`loop` is set (the app does so once its loop runs) every page
    answers 503."""

    def __init__(self, data: UiData) -> None:
        self.data = data
        self.loop: asyncio.AbstractEventLoop | None = None

    def routes(self) -> Mapping[str, Route]:
        return {
            "/ui": self.index,
            "/ui/": self.index,
            "/ui/distribution": self.distribution,
            "/ui/lag": self.lag,
            "/ui/clients": self.clients,
        }

    def index(self, _query: Mapping[str, list[str]]) -> HttpResponse:
        return self._page(self.data.index, render.render_index)

    def distribution(self, _query: Mapping[str, list[str]]) -> HttpResponse:
        return self._page(self.data.distribution, render.render_distribution)

    def lag(self, query: Mapping[str, list[str]]) -> HttpResponse:
        group = (query.get("group") or [""])[0]
        return self._page(lambda: self.data.lag(group), render.render_lag)

    def clients(self, query: Mapping[str, list[str]]) -> HttpResponse:
        group = (query.get("group") or [""])[0]
        return self._page(lambda: self.data.clients(group), render.render_clients)

    def _page(self, gather: Callable[[], Awaitable[V]], draw: Callable[[V], str]) -> HttpResponse:
        loop = self.loop
        if loop is None or loop.is_closed():
            return _html(503, render.render_problem(self._problem(503, "Starting", "not ready")))
        try:
            follower = self._run(loop, self.data.not_leader)
            if follower is not None:
                return _html(200, render.render_not_leader(follower))
            return _html(200, draw(self._run(loop, gather)))
        except DsError as err:
            status = _STATUS.get(err.reason, 500)
            problem = self._problem(status, err.reason.name, err.message)
            return _html(status, render.render_problem(problem))
        except (TimeoutError, concurrent.futures.TimeoutError):
            return _html(
                503,
                render.render_problem(
                    self._problem(503, "Timed out", "the assigner did not answer in time")
                ),
            )

    def _problem(self, status: int, title: str, detail: str) -> Problem:
        return Problem(self.data.page(), status, title, detail)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[V]]) -> V:
        async def call() -> V:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), loop)
        try:
            return future.result(timeout=PAGE_TIMEOUT_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise


def _html(status: int, body: str) -> HttpResponse:
    return HttpResponse(status, body.encode(), HTML)
