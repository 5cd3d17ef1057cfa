"""The one way every client in the tree reaches the assigner, the sidecars and the notifier.

* :mod:`.settings`: :class:`ConnectionSettings` (message sizes, keepalive, reconnect
  backoff, gRPC's own retry of ``UNAVAILABLE`` as a channel service config);
* :mod:`.tls`: :class:`TlsConfig` (the CA, a certificate and key, mTLS, a token file;
  ``DS_TLS__*``), servers' and clients' transport security in one value;
* :mod:`.credentials`: the channel and per-call credentials made from it (TLS, mTLS, the
  bearer token): attached here, once, for every client;
* :mod:`.channels`: :func:`open_channel` and :func:`open_aio_channel`, the only code that
  creates gRPC channels;
* :mod:`.targets`: :class:`AssignerTarget`, where the assigner is (replica addresses, the
  Consul leader key);
* :mod:`.policy` (pure): after a failure, follow ``ds-leader``, retry with jittered
  backoff, or raise; a call's budget;
* :mod:`.follower` and :mod:`.aio_follower`: :class:`LeaderFollower` (threads) and
  :class:`AioLeaderFollower` (asyncio), which hold the leader's address and channel and run
  calls on it; :func:`retry_call` for a peer that is not followed.

Importing this package pulls in neither structlog nor pydantic (Spark workers use it), and
py-consul only once a target with Consul is used.
"""

from dsclient.connection.aio_follower import AioLeaderFollower
from dsclient.connection.channels import open_aio_channel, open_channel
from dsclient.connection.follower import LeaderFollower, retry_call
from dsclient.connection.policy import FOLLOW_ONCE, Backoff, CallPolicy, pause_before_retry
from dsclient.connection.settings import (
    DEFAULT_SETTINGS,
    MAX_MESSAGE_BYTES,
    ConnectionSettings,
    GrpcRetryPolicy,
)
from dsclient.connection.targets import AssignerTarget, LeaderUnknown
from dsclient.connection.tls import PLAINTEXT, TlsConfig

__all__ = [
    "DEFAULT_SETTINGS",
    "FOLLOW_ONCE",
    "MAX_MESSAGE_BYTES",
    "PLAINTEXT",
    "AioLeaderFollower",
    "AssignerTarget",
    "Backoff",
    "CallPolicy",
    "ConnectionSettings",
    "GrpcRetryPolicy",
    "LeaderFollower",
    "LeaderUnknown",
    "TlsConfig",
    "open_aio_channel",
    "open_channel",
    "pause_before_retry",
    "retry_call",
]
