"""What Fetch and Stream share when they write taken records to a client: ``Record``
messages for clients that predate batches, and the message size every client receives.

With ``auto_ack``, records count as acked once written to the client, never before; a
message larger than a client receives by default is refused by the client *after* the
server sent it, unseen by the server, so it is never auto-acked (issue 37, finding 8).
"""

from __future__ import annotations

from typing import Any

import structlog

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import Slice

log = structlog.get_logger(__name__)

# What every gRPC client receives by default (Go, Java, Python, grpcurl: 4 MiB). A larger
# message is refused by the client *after* the server sent it, unseen by the server: an
# auto_ack Fetch is kept within it, and one that is not (a single larger record) is not
# acked (issue 37, finding 8).
CLIENT_RECEIVE_LIMIT = 4 * 1024 * 1024
# auto_ack's byte budget: the limit less room for what the budget estimates (framing).
AUTO_ACK_MAX_BYTES = CLIENT_RECEIVE_LIMIT - 256 * 1024


def fits_any_client(
    response: stream_pb2.FetchResponse | stream_pb2.StreamResponse | bytes,
) -> bool:
    """Whether every client receives ``response`` (:data:`CLIENT_RECEIVE_LIMIT`), a Fetch
    response or a Stream message."""
    size = len(response) if isinstance(response, bytes) else response.ByteSize()
    if size <= CLIENT_RECEIVE_LIMIT:
        return True
    log.warning(
        "auto_ack response larger than clients accept by default: not acked",
        bytes=size,
        limit=CLIENT_RECEIVE_LIMIT,
    )
    return False


def records(slices: list[Slice]) -> list[Any]:
    """DELIVERY_FORMAT_RECORDS: one Record message per record."""
    return [record for s in slices for record in s.to_records()]
