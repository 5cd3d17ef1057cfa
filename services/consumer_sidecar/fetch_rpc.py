"""Fetch: records taken from the partition table for one client, in one response.

A Fetch first applies the acks it carries (``ack_ranges``: the client's previous batch,
instead of an Ack call of its own) and starts their commit, which it does not wait for
(:mod:`carried_acks`: their answer goes with this response if the commit was made by then,
else with the next one to the client). Then, up to its ``max_wait``, it takes what its
limits allow (the :class:`PartitionTable` marks them delivered to the client, holder
stream 0) and answers them as one ``RecordBatch`` per slice (``DELIVERY_FORMAT_BATCHES``,
written to wire bytes straight from the chunks by ``dsclient/records/wire.py``) or one
``Record`` message per record.

Redelivery (ARCHITECTURE §3 "Delivery"): a Fetch whose response was never sent (the call
cancelled: a client deadline, a closed channel) gives its records back at once. With
``auto_ack``, records count as acked once written to the client, never before, and only in
a response every client receives (``delivery_messages.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Any, cast

import grpc.aio

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason, invalid
from dsclient.records import wire
from dsclient.records.batches import Slice
from services.consumer_sidecar.ack_rpcs import AckRpcs
from services.consumer_sidecar.acks import Holder
from services.consumer_sidecar.carried_acks import AckOutbox
from services.consumer_sidecar.client_access import ClientMetrics
from services.consumer_sidecar.delivery_messages import (
    AUTO_ACK_MAX_BYTES,
    fits_any_client,
    records,
)
from services.consumer_sidecar.request_checks import check_caller, fetch_limits
from services.consumer_sidecar.serving import Serving

Context = grpc.aio.ServicerContext[Any, Any]


class FetchRpc:
    """The Fetch RPC over ``serving``; ``clients``: the client-access metrics (None = not
    counted); ``acks``: what applies the acks a Fetch carries."""

    def __init__(
        self, serving: Serving, clients: ClientMetrics | None = None, acks: AckRpcs | None = None
    ) -> None:
        self.serving = serving
        self.clients = clients
        self.acks = acks or AckRpcs(serving, clients)
        self.outbox = AckOutbox()

    async def fetch(
        self, request: stream_pb2.FetchRequest, context: Context
    ) -> stream_pb2.FetchResponse | bytes:
        check_caller(request.client_id, request.group, self.serving.group)
        max_records, max_bytes, max_wait, delivery = fetch_limits(request)
        columns = delivery == stream_pb2.DELIVERY_FORMAT_BATCHES
        if not self.serving.has_joined():
            raise DsError(Reason.SERVICE_NOT_READY, "sidecar has not joined the assigner yet")
        self.serving.data.read()  # a parked fetch loop polls again
        # Carried acks are applied before anything is taken; their commit runs beside the
        # fetch, and its answer goes with the first response to this client after it.
        if request.ack_ranges:
            if request.ack_seq <= 0:
                raise invalid("ack_seq", "must be above 0 when the request carries ack_ranges")
            answer = self.acks.carried(request.client_id, request.ack_ranges)
            self.outbox.add(request.client_id, request.ack_seq, answer)
        holder: Holder = (request.client_id, 0)
        if request.auto_ack:
            max_bytes = min(max_bytes, AUTO_ACK_MAX_BYTES)
        deadline = time.monotonic() + max_wait
        while True:
            taken = self.serving.take(max_records, max_bytes, holder)
            remaining = deadline - time.monotonic()
            if taken or remaining <= 0:
                break
            self.serving.data_ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.serving.data_ready.wait(), remaining)
        answers = self.outbox.take(request.client_id)
        acks = (
            stream_pb2.FetchAckAnswers(
                applied_seq=request.ack_seq if request.ack_ranges else 0, answers=answers
            )
            if request.ack_ranges or answers
            else None
        )
        response: stream_pb2.FetchResponse | bytes = (
            wire.fetch_response(taken, None if acks is None else acks.SerializeToString())
            if columns
            else stream_pb2.FetchResponse(records=records(taken), acks=acks)
        )
        auto_ack = request.auto_ack and fits_any_client(response)
        if taken:
            # Whether the response reaches the client is known when the call ends: only
            # then are auto_ack's records acked, and records of a call that was cancelled
            # (client deadline, closed channel) are delivered again at once. A response
            # some client may refuse unseen is not auto-acked: in flight, acked explicitly
            # or delivered again.
            done = functools.partial(self._fetch_done, taken=taken, auto_ack=auto_ack)
            context.add_done_callback(cast("grpc.aio.DoneCallback[Any, Any]", done))
        if self.clients is not None:
            self.clients.delivered(request.client_id, taken, acked=auto_ack)
        return response

    def _fetch_done(self, context: Any, *, taken: list[Slice], auto_ack: bool) -> None:
        """A Fetch that handed out ``taken`` ended: sent (auto_ack: now acked), or ended
        without its response reaching the client — cancelled before its status was sent
        (the client went away), or past the client's deadline (the client gave up on it) —
        and then its records are delivered again at once. (grpc.aio's ServicerContext has
        ``done``, ``cancelled`` and ``time_remaining``; the stubs lack some.)"""
        remaining = context.time_remaining()
        if context.cancelled() or not context.done() or (remaining is not None and remaining <= 0):
            self.serving.not_sent(taken)
        elif auto_ack:
            self.serving.written(taken)
