"""gRPC method handlers by their shape (request and response streaming or not): building
one, and rebuilding one with its behaviour wrapped, its (de)serializers kept; and the base
of every server interceptor here, which does exactly that for the methods it covers."""

from __future__ import annotations

import abc
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

Behavior = Callable[..., Any]
# wrap(behavior, request_streaming, response_streaming) -> the behavior to serve instead
Wrap = Callable[[Behavior, bool, bool], Behavior]

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def method_handler(
    behavior: Behavior,
    *,
    request_streaming: bool,
    response_streaming: bool,
    request_deserializer: Callable[[bytes], Any] | None,
    response_serializer: Callable[[Any], bytes] | None,
) -> grpc.RpcMethodHandler[Any, Any]:
    factory = _FACTORIES[request_streaming, response_streaming]
    return factory(
        behavior,
        request_deserializer=request_deserializer,
        response_serializer=response_serializer,
    )


def rewrapped(
    handler: grpc.RpcMethodHandler[Any, Any], wrap: Wrap
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` serving ``wrap(its behavior, request_streaming, response_streaming)``."""
    for (request_streaming, response_streaming), behavior in (
        ((False, False), handler.unary_unary),
        ((False, True), handler.unary_stream),
        ((True, False), handler.stream_unary),
        ((True, True), handler.stream_stream),
    ):
        if behavior:
            return method_handler(
                wrap(behavior, request_streaming, response_streaming),
                request_streaming=request_streaming,
                response_streaming=response_streaming,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler  # pragma: no cover - grpc always sets one of the four


class WrappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Serves every method it :meth:`covers` through :meth:`wrap`; the others, and calls
    to unknown methods, pass through untouched."""

    def covers(self, method: str) -> bool:
        """Whether to wrap ``method`` (its full path, ``/package.Service/Method``)."""
        return True

    @abc.abstractmethod
    def wrap(
        self, method: str, behavior: Behavior, request_streaming: bool, response_streaming: bool
    ) -> Behavior:
        """The behavior to serve ``method`` with instead of ``behavior``."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not self.covers(method):
            return handler
        return rewrapped(handler, functools.partial(self.wrap, method))
