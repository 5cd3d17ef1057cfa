"""The client library's own exception."""

from __future__ import annotations


class ClientError(Exception):
    """A call failed with a status the client must not retry (bad request, unknown group).

    Raised for any gRPC status but ``UNAVAILABLE`` (AIP-194: the only one the client
    retries by itself), and by :meth:`~dsclient.DsClient.ack_nowait` on a closed
    client. When a server answered, ``__cause__`` is its :class:`grpc.RpcError`, whose
    status carries the ``google.rpc.ErrorInfo`` reason (README "Errors")."""
