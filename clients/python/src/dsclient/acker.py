"""``ack_nowait``'s thread: acks sent in the order given, those that queue up coalesced."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from dsclient.batch import Span, counted
from dsclient.columns import Release

# Range acks in one coalesced ack_nowait send at most (the sidecar takes 100,000 a message).
MAX_COALESCED_SPANS = 10_000

# One ack_nowait call: its spans, the regions it releases, its future.
_Item = tuple[list[Span], Sequence[Release], Future[int]]


class Acker:
    """``ack_nowait``'s thread: sends the acks queued since its last send as one ack (one
    commit on each sidecar, however many batches queued up meanwhile), in the order of
    the calls, and resolves each call's future with its own records' count.

    Without coalescing, a client that acks faster than a commit takes queued one commit
    per batch, and its acks fell further behind its reads the longer it ran."""

    def __init__(self, send: Callable[[list[Span], Sequence[Release]], list[bool]]) -> None:
        """``send(spans, releases)``: the range acks and the shared-memory regions to give
        back with them (``stream_columns``); whether each span was accepted."""
        self._send = send
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ds-ack", daemon=True)
        self._thread.start()

    def submit(self, spans: list[Span], releases: Sequence[Release] = ()) -> Future[int]:
        future: Future[int] = Future()
        self._queue.put((spans, releases, future))
        return future

    def close(self) -> None:
        """Returns once every ack submitted before it has its answer."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            queued = len(first[0])
            while queued < MAX_COALESCED_SPANS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True  # send what was queued before close(), then stop
                    break
                items.append(item)
                queued += len(item[0])
            self._answer(items)

    def _answer(self, items: list[_Item]) -> None:
        spans = [span for item_spans, _, _ in items for span in item_spans]
        releases = [release for _, item_releases, _ in items for release in item_releases]
        try:
            accepted = self._send(spans, releases)
        except BaseException as exc:  # every caller waiting gets the failure
            for _, _, future in items:
                future.set_exception(exc)
            return
        start = 0
        for item_spans, _, future in items:
            end = start + len(item_spans)
            future.set_result(counted(item_spans, accepted[start:end]))
            start = end
