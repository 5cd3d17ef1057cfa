"""The one place where transport security is attached to the mesh's client channels.

From :class:`~dsclient.connection.tls.TlsConfig` (a field of
:class:`~dsclient.connection.settings.ConnectionSettings`): TLS channel credentials
(the CA that signs the mesh's servers, and the client certificate for mTLS) and per-call
credentials (the bearer token every call carries). Every client of the assigner, the
sidecars and the notifier gets them, because :mod:`channels` is the only code in the tree
that creates a channel.

Files are read through :class:`~dsclient.watched_file.WatchedFile`: a channel
opened after a certificate or key was renewed uses the new one, and the token is read
again (when its file changed) for every call, so a rotated token is sent from the next
call on. A channel already open keeps the TLS material it was made with; the followers
open a new channel whenever they reconnect.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from dsclient.connection.settings import ConnectionSettings
from dsclient.connection.tls import TlsConfig
from dsclient.watched_file import WatchedFile

AUTHORIZATION = "authorization"

_files: dict[Path, WatchedFile[bytes]] = {}
_files_lock = threading.Lock()


def watched_bytes(path: Path) -> WatchedFile[bytes]:
    """The process-wide watcher of ``path`` (one per file, shared by every channel)."""
    with _files_lock:
        watched = _files.get(path)
        if watched is None:
            watched = _files[path] = WatchedFile(path, bytes)
        return watched


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (surrounding white space dropped); ValueError if empty."""
    token = watched_bytes(path).get().decode().strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def channel_credentials(settings: ConnectionSettings) -> grpc.ChannelCredentials | None:
    """TLS for the channel (server authentication, and mTLS with a client certificate);
    None: plaintext."""
    tls = settings.tls
    if not tls.client_enabled:
        return None
    assert tls.ca_file is not None
    key = cert = None
    if tls.cert_file is not None and tls.key_file is not None:
        key = watched_bytes(tls.key_file).get()
        cert = watched_bytes(tls.cert_file).get()
    return grpc.ssl_channel_credentials(watched_bytes(tls.ca_file).get(), key, cert)


class _TokenPlugin(grpc.AuthMetadataPlugin):
    """Adds ``authorization: Bearer <token>`` to every call, the token re-read on change."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            token = read_token(self._path)
        except Exception as exc:  # the call fails with UNAVAILABLE naming the file
            callback((), exc)
            return
        callback(((AUTHORIZATION, f"Bearer {token}"),), None)


def call_credentials(settings: ConnectionSettings) -> grpc.CallCredentials | None:
    """What every call carries to say who calls (a bearer token); None: nothing."""
    if settings.tls.token_file is None:
        return None
    return grpc.metadata_call_credentials(
        _TokenPlugin(settings.tls.token_file), name="dataservice-token"
    )


def credentials(
    settings: ConnectionSettings, *, local: bool = False
) -> grpc.ChannelCredentials | None:
    """The channel's credentials with the per-call ones composed in; None: plaintext.
    A token is never sent in the clear: per-call credentials without TLS are an error.
    ``local``: a channel over a Unix domain socket (``dsclient.local_socket``):
    gRPC's local credentials instead of TLS (the bytes never leave the kernel), the token
    still sent (a server authorizes every call on its socket as on TCP)."""
    if local:
        uds = grpc.local_channel_credentials(grpc.LocalConnectionType.UDS)
        token = call_credentials(settings)
        return uds if token is None else grpc.composite_channel_credentials(uds, token)
    channel = channel_credentials(settings)
    call = call_credentials(settings)
    if call is None:
        return channel
    if channel is None:
        raise ValueError("per-call credentials (a token) need TLS channel credentials")
    return grpc.composite_channel_credentials(channel, call)


def check_readable(tls: TlsConfig) -> None:
    """Read every file ``tls`` names once, so a process fails at start with one line
    naming a missing or unreadable file rather than at its first call."""
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        if path is not None:
            watched_bytes(path).get()
    for token in (tls.token_file, tls.sidecar_token_file, tls.notifier_token_file):
        if token is not None:
            read_token(token)
