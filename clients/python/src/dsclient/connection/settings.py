"""How every client channel of the mesh is configured, in one frozen value.

:class:`ConnectionSettings` is what :func:`~dsclient.connection.channels.open_channel`
turns into gRPC channel options: message sizes, keepalive, how fast a lost connection is
tried again, and a service config with gRPC's own retry of ``UNAVAILABLE`` (AIP-194,
gRFC A6), and transport security (:class:`~dsclient.connection.tls.TlsConfig`: the
CA, a client certificate, a token file), which
:mod:`~dsclient.connection.credentials` turns into credentials.

Nothing here imports structlog or pydantic: Spark's Python workers import this module, and
each of them starts a fresh interpreter.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from dsclient.connection.tls import PLAINTEXT, TlsConfig

# Messages up to 64 MiB: ReadRange and Fetch batches can be large; the sidecar bounds them.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

ChannelOptions = list[tuple[str, Any]]


@dataclass(frozen=True)
class GrpcRetryPolicy:
    """gRPC's built-in retry of a call that failed with ``UNAVAILABLE`` (and nothing else:
    only that status says the request was not acted on). Attempt n (n ≥ 1) waits
    random(0, min(initial · multiplier^(n-1), maximum)) seconds (gRFC A6); gRPC caps
    ``max_attempts`` at 5. A caller that needs a longer budget retries on top of this
    with :class:`~dsclient.connection.policy.CallPolicy`."""

    max_attempts: int = 4
    initial_backoff: float = 0.05
    max_backoff: float = 0.5
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 2 <= self.max_attempts <= 5:
            raise ValueError("gRPC retries take max_attempts from 2 to 5")
        if not 0 < self.initial_backoff <= self.max_backoff or self.multiplier <= 0:
            raise ValueError("backoffs must be positive, initial ≤ maximum, multiplier > 0")


@dataclass(frozen=True)
class ConnectionSettings:
    """How to reach a service of the mesh. The defaults are what every service uses."""

    max_send_bytes: int = MAX_MESSAGE_BYTES
    max_receive_bytes: int = MAX_MESSAGE_BYTES
    keepalive_seconds: float = 20.0
    # A lost connection is tried again after 0.1 s, backing off to 1 s at most (gRPC's own
    # default grows to 120 s): a sidecar must re-attach to a restarted assigner within the
    # lease TTL plus grace, and a channel is kept for as long as its peer is followed.
    reconnect_initial_seconds: float = 0.1
    reconnect_max_seconds: float = 1.0
    # None: gRPC does not retry; every failure reaches the caller at once.
    retry: GrpcRetryPolicy | None = field(default_factory=GrpcRetryPolicy)
    # TLS, mTLS and the bearer token; PLAINTEXT: none of them (loopback, `make run`).
    tls: TlsConfig = PLAINTEXT
    # Over a sidecar's local socket, a Stream's batches, acks and answers go as frames on
    # the sidecar's frame socket, not as gRPC messages (StreamOpen.frame_socket; issue 34).
    # False: every message on the gRPC call (for comparison, or a sidecar whose frame
    # socket cannot be reached; a refusing sidecar is detected without it).
    frame_socket: bool = True

    def with_tls(self, tls: TlsConfig) -> ConnectionSettings:
        """These settings over ``tls``."""
        return dataclasses.replace(self, tls=tls)


DEFAULT_SETTINGS = ConnectionSettings()


def service_config(settings: ConnectionSettings) -> str | None:
    """The channel's service config (JSON): one method config for every method (an empty
    name), with the retry policy; None when gRPC should not retry."""
    retry = settings.retry
    if retry is None:
        return None
    policy = {
        "maxAttempts": retry.max_attempts,
        "initialBackoff": f"{retry.initial_backoff}s",
        "maxBackoff": f"{retry.max_backoff}s",
        "backoffMultiplier": retry.multiplier,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": policy}]})


def channel_options(settings: ConnectionSettings) -> ChannelOptions:
    """The gRPC channel arguments ``settings`` stand for."""
    options: ChannelOptions = [
        ("grpc.max_send_message_length", settings.max_send_bytes),
        ("grpc.max_receive_message_length", settings.max_receive_bytes),
        ("grpc.keepalive_time_ms", int(settings.keepalive_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.initial_reconnect_backoff_ms", int(settings.reconnect_initial_seconds * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(settings.reconnect_max_seconds * 1000)),
    ]
    if settings.tls.server_name:
        options.append(("grpc.ssl_target_name_override", settings.tls.server_name))
    config = service_config(settings)
    if config is None:
        options.append(("grpc.enable_retries", 0))
    else:
        options += [("grpc.enable_retries", 1), ("grpc.service_config", config)]
    return options
