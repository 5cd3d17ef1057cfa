"""The one place where transport security is attached to the mesh's client channels.

Both functions return None today: every channel is plaintext, as the embedded default on
loopback is (ARCHITECTURE §8). The security work fills them from
:class:`~services.runtime.connection.settings.ConnectionSettings` (a CA bundle, a client
certificate and key reloaded on change; a token source) and every client of the assigner,
the sidecars and the notifier gets them, because :mod:`channels` is the only code in the
tree that creates a channel.
"""

from __future__ import annotations

import grpc

from services.runtime.connection.settings import ConnectionSettings


def channel_credentials(settings: ConnectionSettings) -> grpc.ChannelCredentials | None:
    """TLS for the channel (server authentication, and mTLS with a client certificate);
    None: plaintext."""
    return None


def call_credentials(settings: ConnectionSettings) -> grpc.CallCredentials | None:
    """What every call carries to say who calls (a bearer token); None: nothing."""
    return None


def credentials(settings: ConnectionSettings) -> grpc.ChannelCredentials | None:
    """The channel's credentials with the per-call ones composed in; None: plaintext.
    A token is never sent in the clear: per-call credentials without TLS are an error."""
    channel = channel_credentials(settings)
    call = call_credentials(settings)
    if call is None:
        return channel
    if channel is None:
        raise ValueError("per-call credentials (a token) need TLS channel credentials")
    return grpc.composite_channel_credentials(channel, call)
