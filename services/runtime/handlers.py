"""gRPC method handlers by their shape (request and response streaming or not): building
one, and rebuilding one with its behaviour wrapped (what every server interceptor here
does), its (de)serializers kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

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
