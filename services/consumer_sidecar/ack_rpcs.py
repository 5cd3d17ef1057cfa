"""Ack and Nack: a client's acks and nacks applied, counted and answered (also for a
Stream's ``acks`` and ``nacks`` messages, ``stream_rpc.py``).

Acks (the Ack RPC and a Stream's ``acks``), one per record or one per offset range, go through
:meth:`LeaseKeeper.ack` / :meth:`LeaseKeeper.ack_range`, and are answered accepted only once
a commit covering them is durable (an ack whose commit could not be made is refused, with
why). A record in flight to another client is refused to the caller (NOT_HOLDER). ``Nack``
(and a Stream's ``nacks``) gives back the caller's records, now or after a delay.

Stale epochs (README "Errors"): an ``Ack`` request whose every ack is refused because its
lease epoch is not the partition's current one fails as a whole with
``FAILED_PRECONDITION``/``LEASE_EPOCH_STALE`` (metadata: topic, partition, epoch,
current_epoch of the first ack or range, and how many were stale) — the client's records moved
and will be redelivered. A request with at least one other outcome answers per record
(``rejected_acks``, reason ``STALE_EPOCH``), and so does a Stream's ``ack_result`` (one
stale ack must not end a stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason, invalid
from services.consumer_sidecar.client_access import ClientMetrics, acked_records
from services.consumer_sidecar.lease_checks import Problem
from services.consumer_sidecar.partitions import Partition
from services.consumer_sidecar.request_checks import (
    check_caller,
    validate_acks,
    validate_delay,
    validate_ranges,
)
from services.consumer_sidecar.serving import Serving
from services.runtime.topic_partition import TP

Ack = TypeVar("Ack", stream_pb2.RecordAck, stream_pb2.RangeAck)
Rejected = TypeVar("Rejected", stream_pb2.RejectedAck, stream_pb2.RejectedRangeAck)


def sort_out(
    acks: Iterable[Ack], rejection_of: Callable[[Ack], Rejected | None]
) -> tuple[list[Ack], list[Rejected]]:
    """``acks`` (records or ranges, acked or nacked) split, in order, into those
    ``rejection_of`` lets through (None) and the rejections of the others: one rule for
    both kinds and every step (apply, refuse after a failed commit, nack)."""
    accepted: list[Ack] = []
    rejected: list[Rejected] = []
    for ack in acks:
        rejection = rejection_of(ack)
        if rejection is None:
            accepted.append(ack)
        else:
            rejected.append(rejection)
    return accepted, rejected


def rejecting(
    problem_of: Callable[[Ack], Problem | None], rejection: Callable[..., Rejected]
) -> Callable[[Ack], Rejected | None]:
    """The rejection (RejectedAck or RejectedRangeAck) of an ack ``problem_of`` finds a
    problem with; None when it finds none."""

    def rejection_of(ack: Ack) -> Rejected | None:
        problem = problem_of(ack)
        if problem is None:
            return None
        return rejection(ack=ack, reason=problem[0], message=problem[1])

    return rejection_of


@dataclass(frozen=True)
class NackOutcome:
    """What one Nack request (or a Stream's ``nacks`` message) came to."""

    nacked: int
    records: int
    rejected: list[stream_pb2.RejectedAck]
    rejected_ranges: list[stream_pb2.RejectedRangeAck]


@dataclass(frozen=True)
class AckOutcome:
    """What one Ack request (or a Stream's ``acks`` message) came to. ``touched``: each
    partition an accepted ack applied to, with its acks' version right after."""

    accepted: int
    rejected: list[stream_pb2.RejectedAck]
    rejected_ranges: list[stream_pb2.RejectedRangeAck]
    accepted_acks: list[stream_pb2.RecordAck] = field(default_factory=list)
    accepted_ranges: list[stream_pb2.RangeAck] = field(default_factory=list)
    touched: dict[TP, tuple[Partition, int]] = field(default_factory=dict)

    def refused(self, failed: dict[TP, Problem]) -> AckOutcome:
        """The accepted acks of partitions whose commit could not be made, refused."""
        if not failed:
            return self

        def problem(ack: stream_pb2.RecordAck | stream_pb2.RangeAck) -> Problem | None:
            return failed.get(TP(ack.topic, ack.partition))

        acks, rejected = sort_out(self.accepted_acks, rejecting(problem, stream_pb2.RejectedAck))
        ranges, rejected_ranges = sort_out(
            self.accepted_ranges, rejecting(problem, stream_pb2.RejectedRangeAck)
        )
        return AckOutcome(
            len(acks) + len(ranges),
            [*self.rejected, *rejected],
            [*self.rejected_ranges, *rejected_ranges],
            acks,
            ranges,
        )

    def result(self) -> stream_pb2.StreamAckResult:
        """The answer to these acks on a Stream or carried by a Fetch."""
        return stream_pb2.StreamAckResult(
            acked_count=self.accepted,
            rejected_acks=self.rejected,
            rejected_ranges=self.rejected_ranges,
        )

    def all_stale(self) -> bool:
        stale = stream_pb2.REJECT_REASON_STALE_EPOCH
        return (
            self.accepted == 0
            and bool(self.rejected or self.rejected_ranges)
            and all(r.reason == stale for r in self.rejected)
            and all(r.reason == stale for r in self.rejected_ranges)
        )


class AckRpcs:
    """The Ack and Nack RPCs, and the acks and nacks a Stream reads, over ``serving``;
    ``clients``: the client-access metrics (None = not counted)."""

    def __init__(self, serving: Serving, clients: ClientMetrics | None = None) -> None:
        self.serving = serving
        self.clients = clients
        self._carried: set[asyncio.Future[stream_pb2.StreamAckResult]] = set()

    async def ack(self, request: stream_pb2.AckRequest) -> stream_pb2.AckResponse:
        check_caller(request.client_id, request.group, self.serving.group)
        if not request.acks and not request.ranges:
            raise invalid("acks", "name at least one record or range")
        validate_acks("acks", request.acks)
        validate_ranges("ranges", request.ranges)
        outcome = self.apply_acks(request.client_id, request.acks, request.ranges)
        if outcome.all_stale():
            self.count_acks(request.client_id, request.acks, request.ranges, outcome)
            raise self._stale_epoch(outcome)
        if outcome.accepted:
            outcome = outcome.refused(await self.serving.commit_acked(outcome.touched))
        self.count_acks(request.client_id, request.acks, request.ranges, outcome)
        return stream_pb2.AckResponse(
            acked_count=outcome.accepted,
            rejected_acks=outcome.rejected,
            rejected_ranges=outcome.rejected_ranges,
        )

    def carried(self, client_id: str, ranges: Any) -> asyncio.Future[stream_pb2.StreamAckResult]:
        """A Fetch's ``ack_ranges``: checked and applied now, as Ack's ranges are (a
        malformed range raises INVALID_ARGUMENT and applies nothing), so the fetch takes
        records after them; their commit runs on its own (a fetch cancelled meanwhile does
        not stop it), and the answer is ready once it is made. Every refusal (a stale epoch
        too) is in the answer, not the call's status; a commit Kafka refused refuses the
        ranges it would have made durable (COMMIT_FAILED: the acks stay recorded, the next
        commit takes them)."""
        validate_ranges("ack_ranges", ranges)
        outcome = self.apply_acks(client_id, (), ranges)
        task = asyncio.ensure_future(self._commit_carried(client_id, ranges, outcome))
        self._carried.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._carried.discard)
        return task

    async def _commit_carried(
        self, client_id: str, ranges: Any, outcome: AckOutcome
    ) -> stream_pb2.StreamAckResult:
        if outcome.accepted:
            try:
                failed = await self.serving.commit_acked(outcome.touched)
            except DsError as err:
                failed = {
                    tp: (stream_pb2.REJECT_REASON_COMMIT_FAILED, err.message)
                    for tp in outcome.touched
                }
            outcome = outcome.refused(failed)
        self.count_acks(client_id, (), ranges, outcome)
        return outcome.result()

    def apply_acks(self, client: str, acks: Any, ranges: Any) -> AckOutcome:
        """Acks from ``client``: a record in flight to another client is refused to it
        (REJECT_REASON_NOT_HOLDER)."""
        accepted_acks, rejected = sort_out(acks, lambda ack: self.serving.ack(ack, client))
        accepted_ranges, rejected_ranges = sort_out(
            ranges, lambda rack: self.serving.ack_range(rack, client)
        )
        touched: dict[TP, tuple[Partition, int]] = {}
        for acked in (*accepted_acks, *accepted_ranges):
            tp = TP(acked.topic, acked.partition)
            part = self.serving.partition(tp)
            if tp not in touched and part is not None:
                touched[tp] = (part, part.acks.version)
        return AckOutcome(
            len(accepted_acks) + len(accepted_ranges),
            rejected,
            rejected_ranges,
            accepted_acks,
            accepted_ranges,
            touched,
        )

    def nack(self, request: stream_pb2.NackRequest) -> stream_pb2.NackResponse:
        check_caller(request.client_id, request.group, self.serving.group)
        if not request.all and not request.records and not request.ranges:
            raise invalid("records", "name at least one record or range, or set all")
        validate_acks("records", request.records)
        validate_ranges("ranges", request.ranges)
        delay = validate_delay("delay", request)
        outcome = self.apply_nacks(request.client_id, request.records, request.ranges, delay)
        nacked, records = outcome.nacked, outcome.records
        if request.all:
            nacked += 1
            records += self.serving.nack_all(request.client_id, delay)
        return stream_pb2.NackResponse(
            nacked_count=nacked,
            rejected_acks=outcome.rejected,
            rejected_ranges=outcome.rejected_ranges,
            records=records,
        )

    def apply_nacks(self, client_id: str, acks: Any, ranges: Any, delay: float) -> NackOutcome:
        """Each named record and range of ``client_id``'s given back (after ``delay``)."""
        records = 0

        def nack(
            ack: stream_pb2.RecordAck | stream_pb2.RangeAck, lo: int, hi: int
        ) -> Problem | None:
            nonlocal records
            problem, count = self.serving.nack_range(
                ack.topic, ack.partition, ack.lease_epoch, lo, hi, client_id, delay
            )
            if problem is None:
                records += count
            return problem

        nacked_acks, rejected = sort_out(
            acks,
            rejecting(lambda ack: nack(ack, ack.offset, ack.offset + 1), stream_pb2.RejectedAck),
        )
        nacked_ranges, rejected_ranges = sort_out(
            ranges,
            rejecting(
                lambda rack: nack(rack, rack.from_offset, rack.to_offset),
                stream_pb2.RejectedRangeAck,
            ),
        )
        return NackOutcome(
            len(nacked_acks) + len(nacked_ranges), records, rejected, rejected_ranges
        )

    def count_acks(self, client_id: str, acks: Any, ranges: Any, outcome: AckOutcome) -> None:
        if self.clients is not None:
            records = acked_records(acks, ranges, outcome.rejected, outcome.rejected_ranges)
            self.clients.acked(client_id, records)

    def _stale_epoch(self, outcome: AckOutcome) -> DsError:
        first: stream_pb2.RecordAck | stream_pb2.RangeAck = (
            outcome.rejected[0].ack if outcome.rejected else outcome.rejected_ranges[0].ack
        )
        part = self.serving.partition(TP(first.topic, first.partition))
        current = part.epoch if part is not None else -1
        return DsError(
            Reason.LEASE_EPOCH_STALE,
            f"{first.topic}[{first.partition}]: epoch {first.lease_epoch} is not the current "
            f"epoch {current}; the records will be redelivered",
            metadata={
                "topic": first.topic,
                "partition": str(first.partition),
                "epoch": str(first.lease_epoch),
                "current_epoch": str(current),
                "stale_acks": str(len(outcome.rejected) + len(outcome.rejected_ranges)),
            },
        )
