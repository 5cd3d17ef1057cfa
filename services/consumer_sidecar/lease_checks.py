"""Whether a lease may be committed, read or acked right now, and why not (pure).

The lease checks the keeper (:mod:`leasing`), the committer (:mod:`lease_commits`) and
the RPCs answer with: each a (RejectReason, message) :data:`Problem`, or None.
"""

from __future__ import annotations

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.acks import AckError, NotHolderError
from services.consumer_sidecar.partitions import Partition

Problem = tuple[stream_pb2.RejectReason.ValueType, str]  # why an ack or nack is refused


def lease_problem(
    part: Partition | None, now: float, epoch: int | None = None
) -> tuple[stream_pb2.RejectReason.ValueType, str] | None:
    """Why ``part`` may not be committed (or read) under ``epoch`` right now, as a
    (RejectReason, message); None if its lease is held, set up, live and at that epoch."""
    if part is None:
        return stream_pb2.REJECT_REASON_NOT_HELD, "not leased by this sidecar"
    if part.revoking:
        return stream_pb2.REJECT_REASON_NOT_HELD, "the lease is being handed off"
    if epoch is not None and epoch != part.epoch:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} is not the current epoch {part.epoch}",
        )
    if not part.ready or not part.confirmed:
        return stream_pb2.REJECT_REASON_NOT_HELD, "the lease was just granted; retry shortly"
    if not part.live(now) or part.suspended_at is not None:
        return stream_pb2.REJECT_REASON_LEASE_EXPIRED, "the local lease deadline passed"
    return None


def ack_error_reason(exc: AckError) -> stream_pb2.RejectReason.ValueType:
    """The reject reason for an ack the partition's tracker refused."""
    if isinstance(exc, NotHolderError):
        return stream_pb2.REJECT_REASON_NOT_HOLDER
    return stream_pb2.REJECT_REASON_NOT_DELIVERED


def ack_problem(
    part: Partition | None, epoch: int, name: str, now: float, retired: int | None = None
) -> Problem | None:
    """Why an ack (or nack) under ``epoch`` is refused, or None. A partition whose local
    lease deadline passed cannot commit, so its acks are refused too (the records come
    again from whoever holds it next); one being handed off still takes acks while its
    lease lasts (the revoke's drain waits for them). ``retired``: the epoch this sidecar
    gave ``name`` up under for a configuration change."""
    if part is None and retired is not None and epoch <= retired:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} of {name} was retired (offset reset or mode switch); its records "
            "come again from the new position",
        )
    if part is None:
        return stream_pb2.REJECT_REASON_NOT_HELD, f"{name} is not leased by this sidecar"
    if epoch != part.epoch:
        return (
            stream_pb2.REJECT_REASON_STALE_EPOCH,
            f"epoch {epoch} is not the current epoch {part.epoch}",
        )
    if not part.live(now) or part.suspended_at is not None:
        return (
            stream_pb2.REJECT_REASON_LEASE_EXPIRED,
            f"{name}: the local lease deadline passed; the records will be redelivered",
        )
    return None
