"""How a servicer's :class:`~dsclient.reasons.DsError` becomes its gRPC status with
ErrorInfo (AIP-193): :func:`abort`, and :class:`ErrorInterceptor`, the outermost interceptor
of every server. The catalogue itself (:mod:`dsclient.reasons`) is shared with the
clients; this half only servers use."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc.aio
from grpc_status import rpc_status

from dsclient.reasons import DsError
from services.runtime.handlers import Behavior, WrappingInterceptor


async def abort(context: grpc.aio.ServicerContext[Any, Any], err: DsError) -> NoReturn:
    status = rpc_status.to_status(err.to_status())
    trailing = tuple(status.trailing_metadata) + tuple(err.trailing.items())
    await context.abort(status.code, status.details, trailing)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class ErrorInterceptor(WrappingInterceptor):
    """Turns :class:`DsError` raised by any handler into its status with ErrorInfo."""

    def wrap(
        self, method: str, behavior: Behavior, request_streaming: bool, response_streaming: bool
    ) -> Behavior:
        return _wrap_stream(behavior) if response_streaming else _wrap_unary(behavior)


def _wrap_unary(behavior: Behavior) -> Behavior:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behavior(request, context)
        except DsError as err:
            await abort(context, err)

    return wrapped


def _wrap_stream(behavior: Behavior) -> Behavior:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for response in behavior(request, context):
                yield response
        except DsError as err:
            await abort(context, err)

    return wrapped
