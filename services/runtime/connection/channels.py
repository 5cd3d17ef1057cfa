"""The only places in the tree that create gRPC client channels (tests aside).

Each channel gets the options and the retrying service config of its
:class:`~services.runtime.connection.settings.ConnectionSettings`, and the credentials of
:mod:`~services.runtime.connection.credentials` (plaintext while those are None).
"""

from __future__ import annotations

import grpc
import grpc.aio

from services.runtime.connection.credentials import credentials
from services.runtime.connection.settings import (
    DEFAULT_SETTINGS,
    ConnectionSettings,
    channel_options,
)


def open_channel(target: str, settings: ConnectionSettings = DEFAULT_SETTINGS) -> grpc.Channel:
    """A synchronous channel to ``target`` (``HOST:PORT``), for threads."""
    secure = credentials(settings)
    if secure is None:
        return grpc.insecure_channel(target, options=channel_options(settings))
    return grpc.secure_channel(target, secure, options=channel_options(settings))


def open_aio_channel(
    target: str, settings: ConnectionSettings = DEFAULT_SETTINGS
) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (``HOST:PORT``), for the running event loop."""
    secure = credentials(settings)
    if secure is None:
        return grpc.aio.insecure_channel(target, options=channel_options(settings))
    return grpc.aio.secure_channel(target, secure, options=channel_options(settings))
