"""``request_id`` (AIP-155): a mutating admin RPC retried with the same id is applied once.

Documented limit, until durable assigner state carries them: request_ids are remembered in
memory for :data:`IDEMPOTENCY_TTL_SECONDS`; they do not survive an assigner restart or
failover. Only successful responses are remembered: a retry of a failed request runs again.
The clock is a parameter; nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import message

from dsclient.reasons import DsError, Reason
from services.assigner.admin.validation import validate_request_id

M = TypeVar("M", bound=message.Message)

IDEMPOTENCY_TTL_SECONDS = 600.0
IDEMPOTENCY_MAX_ENTRIES = 10_000


@dataclass
class _Entry:
    fingerprint: bytes
    response: message.Message
    stored_at: float


def fingerprint(rpc: str, request: message.Message) -> bytes:
    """What makes two requests "the same": the RPC and every field but request_id."""
    body = type(request)()
    body.CopyFrom(request)
    body.ClearField("request_id")
    return hashlib.sha256(
        rpc.encode() + b"\0" + body.SerializeToString(deterministic=True)
    ).digest()


class IdempotencyCache:
    """request_id -> the first successful response, for ``ttl`` seconds (in memory).

    A retry with the same request_id and the same body gets the stored response without the
    change being applied again; the same request_id with another body is refused
    (INVALID_ARGUMENT). Concurrent calls with one request_id run the change once: the later
    ones wait for the first. Failures are not remembered, so a failed request may be retried.
    """

    def __init__(
        self,
        ttl: float = IDEMPOTENCY_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = IDEMPOTENCY_MAX_ENTRIES,
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._inflight: dict[str, tuple[bytes, asyncio.Future[message.Message]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, request_id: str, print_: bytes) -> message.Message | None:
        self._expire()
        entry = self._entries.get(request_id)
        if entry is None:
            return None
        if entry.fingerprint != print_:
            raise reused_request_id(request_id)
        return entry.response

    def store(self, request_id: str, print_: bytes, response: message.Message) -> None:
        self._expire()
        while len(self._entries) >= self.max_entries:
            self._entries.pop(next(iter(self._entries)))  # oldest first (insertion order)
        self._entries[request_id] = _Entry(print_, response, self.clock())

    def _expire(self) -> None:
        cutoff = self.clock() - self.ttl
        for request_id in [r for r, e in self._entries.items() if e.stored_at <= cutoff]:
            del self._entries[request_id]

    async def run(
        self, rpc: str, request: message.Message, request_id: str, call: Callable[[], Awaitable[M]]
    ) -> M:
        """``call()`` at most once per (request_id, body) within the TTL."""
        if not validate_request_id(request_id):
            return await call()
        print_ = fingerprint(rpc, request)
        stored = self.lookup(request_id, print_)
        if stored is not None:
            return _copy(stored)  # type: ignore[return-value]
        inflight = self._inflight.get(request_id)
        if inflight is not None:
            if inflight[0] != print_:
                raise reused_request_id(request_id)
            return _copy(await asyncio.shield(inflight[1]))  # type: ignore[return-value]
        future: asyncio.Future[message.Message] = asyncio.get_running_loop().create_future()
        self._inflight[request_id] = (print_, future)
        try:
            response = await call()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._inflight[request_id]
        self.store(request_id, print_, _copy(response))
        future.set_result(response)
        return response


def reused_request_id(request_id: str) -> DsError:
    return DsError(
        Reason.INVALID_FIELD,
        "request_id: already used for a different request; use a new request_id",
        metadata={"field": "request_id", "request_id": request_id},
    )


def _copy(response: M) -> M:
    copy = type(response)()
    copy.CopyFrom(response)
    return copy
