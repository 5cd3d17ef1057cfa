"""The only places in the tree that create gRPC client channels (tests aside).

Each channel gets the options and the retrying service config of its
:class:`~dsclient.connection.settings.ConnectionSettings`, and the credentials of
:mod:`~dsclient.connection.credentials` (plaintext while those are None). A
``unix:`` target (a sidecar's socket for its pod, :mod:`dsclient.local_socket`)
gets gRPC's local credentials with the token instead of TLS.
"""

from __future__ import annotations

import grpc
import grpc.aio

from dsclient.connection.credentials import credentials
from dsclient.connection.settings import (
    DEFAULT_SETTINGS,
    ConnectionSettings,
    channel_options,
)
from dsclient.local_socket import SCHEME as LOCAL_SCHEME


def open_channel(target: str, settings: ConnectionSettings = DEFAULT_SETTINGS) -> grpc.Channel:
    """A synchronous channel to ``target`` (``HOST:PORT``, or ``unix:PATH``), for threads."""
    secure = credentials(settings, local=target.startswith(LOCAL_SCHEME))
    if secure is None:
        return grpc.insecure_channel(target, options=channel_options(settings))
    return grpc.secure_channel(target, secure, options=channel_options(settings))


def open_aio_channel(
    target: str, settings: ConnectionSettings = DEFAULT_SETTINGS
) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (``HOST:PORT``, or ``unix:PATH``), for the running
    event loop."""
    secure = credentials(settings, local=target.startswith(LOCAL_SCHEME))
    if secure is None:
        return grpc.aio.insecure_channel(target, options=channel_options(settings))
    return grpc.aio.secure_channel(target, secure, options=channel_options(settings))
