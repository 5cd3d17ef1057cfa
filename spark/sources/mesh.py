"""How the ``dataservice`` source talks to the mesh: the assigner and the sidecars.

* :class:`AssignerClient` — ``AdminService.DescribeGroup`` (the group's topics, members and
  their endpoints, who leases which partition at which epoch, committed and end offsets)
  on the leader, through the runtime's ``LeaderFollower``: following a follower's
  ``ds-leader`` redirect, the other ``assigner`` addresses, or the leader key in Consul,
  and retrying ``UNAVAILABLE`` (AIP-194).
* :func:`read_range` — one input partition's exact ``[from, to)`` through the owning
  sidecar's ``ReadRange``, chunk by chunk. When the owner goes away (``UNAVAILABLE``) or
  the lease moved (``LEASE_NOT_HELD``), it asks the assigner who holds the partition now
  and goes on from the first offset it has not returned yet, so every record of the range
  is returned exactly once however often the lease moves.
* :func:`commit_offsets` — ``CommitOffsets`` on the sidecars that hold the partitions
  *now*, as their own ``Status`` says (their lease epoch fences the commit), retried while
  leases move.

Nothing here imports Spark: executors and the driver's source worker both use it. Every
channel comes from ``dsclient.connection``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.connection import (
    MAX_MESSAGE_BYTES,
    AssignerTarget,
    Backoff,
    CallPolicy,
    ConnectionSettings,
    LeaderFollower,
    LeaderUnknown,
    TlsConfig,
    open_channel,
)
from dsclient.reasons import Reason, error_info
from services.runtime.topic_partition import TP

# Standard logging, not structlog: this runs in every Spark Python worker, where importing
# structlog (and pydantic, the services' settings) would cost each worker start; the
# runtime's connection module imports neither.
log = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_SECONDS = 10.0
# ReadRange chunks are up to 64 MiB of records: room for their framing on top.
CONNECTION = ConnectionSettings(max_receive_bytes=MAX_MESSAGE_BYTES + 1024 * 1024)


def connection() -> ConnectionSettings:
    """:data:`CONNECTION` with the TLS, mTLS and token files of the ``DS_TLS__*`` variables
    (the services' own; Spark's Python workers inherit the driver's environment)."""
    return CONNECTION.with_tls(TlsConfig.from_env())


# A probe that is always out of range (to_offset beyond any log): the sidecar answers
# OUT_OF_RANGE with the partition's log start offset and high watermark, reading nothing.
PROBE_TO_OFFSET = 2**62
PROVE_CHUNK_BYTES = 4 << 20  # ReadRange chunks when reading a span again to commit it
# Failures after which the owner of a partition is looked up again and the call retried.
RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# DescribeGroup: retried on those failures and through an election, backing off from
# 0.1 s to 2 s, for as long as the caller's timeout allows (its deadline).
DESCRIBE_CALLS = CallPolicy(attempts=None, retry_codes=RETRY_CODES, backoff=Backoff(0.1, 2.0))
MOVED_REASONS = frozenset(
    {
        Reason.LEASE_NOT_HELD.value,
        Reason.LEASE_EPOCH_STALE.value,
        Reason.GROUP_NOT_SERVED.value,
        Reason.SERVICE_NOT_READY.value,
        Reason.KAFKA_UNAVAILABLE.value,
        # The owner runs as many ReadRange streams as it may: back off and try again.
        Reason.TOO_MANY_RANGE_READS.value,
    }
)


class MeshError(RuntimeError):
    """A call to the mesh failed for good (bad request, unknown group, data loss, no owner
    for a partition within the read timeout)."""


class DataLossError(MeshError):
    """Records of a planned range are gone from Kafka (retention, a recreated topic)."""


@dataclass(frozen=True)
class LeaseInfo:
    holder: str  # sidecar id; "" when unassigned
    epoch: int
    state: int  # types_pb2.LeaseState


@dataclass(frozen=True)
class GroupView:
    """One DescribeGroup answer."""

    group: str
    topics: tuple[str, ...]
    members: Mapping[str, str]  # sidecar id -> StreamService endpoint
    leases: Mapping[TP, LeaseInfo]
    ends: Mapping[TP, int]  # high watermarks
    committed: Mapping[TP, int]  # -1 = nothing committed

    @classmethod
    def from_proto(cls, group: str, response: admin_pb2.DescribeGroupResponse) -> GroupView:
        return cls(
            group=group,
            topics=tuple(response.config.topics),
            members={m.sidecar_id: m.endpoint for m in response.members},
            leases={
                TP(lease.topic, lease.partition): LeaseInfo(lease.holder, lease.epoch, lease.state)
                for lease in response.leases
            },
            ends={TP(p.topic, p.partition): p.end_offset for p in response.partitions},
            committed={TP(p.topic, p.partition): p.committed_offset for p in response.partitions},
        )

    def endpoint_of(self, tp: TP) -> str | None:
        """Where the assigner says the partition is served, if anywhere."""
        lease = self.leases.get(tp)
        if lease is None or not lease.holder or lease.state == types_pb2.LEASE_STATE_UNASSIGNED:
            return None
        return self.members.get(lease.holder)


def _reason(err: grpc.RpcError) -> str:
    info = error_info(err)
    return info.reason if info is not None else ""


def _describe_error(err: grpc.RpcError) -> str:
    return f"{err.code().name}: {err.details()}"


class AssignerClient:
    """DescribeGroup on the assigner leader. Thread-safe."""

    def __init__(
        self,
        addresses: Sequence[str],
        consul: str | None = None,
        *,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        try:
            target = AssignerTarget(tuple(addresses), consul)
        except LeaderUnknown as exc:
            raise MeshError(str(exc)) from None
        self._call_timeout = call_timeout
        self._assigner = LeaderFollower(target, connection())
        try:
            self._assigner.locate()
        except Exception as exc:  # Consul down: start with the addresses we have
            log.info("consul %s: leader lookup failed: %s", consul, exc)

    def describe(self, group: str, timeout: float = 60.0) -> GroupView:
        """The group as the assigner leader sees it now; retries for up to ``timeout``."""
        request = admin_pb2.DescribeGroupRequest(group=group)
        try:
            response = self._assigner.call(
                admin_pb2_grpc.AdminServiceStub,
                lambda stub: stub.DescribeGroup(request, timeout=self._call_timeout),
                dataclasses.replace(DESCRIBE_CALLS, deadline=timeout),
            )
        except LeaderUnknown as exc:
            raise MeshError(str(exc)) from None
        except grpc.RpcError as err:
            if err.code() in RETRY_CODES or _reason(err) == Reason.NOT_LEADER.value:
                raise MeshError(
                    f"DescribeGroup({group}): no answer within {timeout:.0f} s: "
                    f"{_describe_error(err)}"
                ) from err
            raise MeshError(f"DescribeGroup({group}): {_describe_error(err)}") from err
        return GroupView.from_proto(group, response)

    def close(self) -> None:
        self._assigner.close()


class SidecarPool:
    """One channel per sidecar endpoint, kept for reuse, and which endpoints refused the
    ARROW_IPC read format (so they are asked for records from then on). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._records_only: set[str] = set()

    def arrow_refused(self, endpoint: str) -> None:
        with self._lock:
            self._records_only.add(endpoint)

    def takes_arrow(self, endpoint: str) -> bool:
        with self._lock:
            return endpoint not in self._records_only

    def stub(self, endpoint: str) -> stream_pb2_grpc.StreamServiceStub:
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                # A sidecar gets the sidecar token (DS_TLS__SIDECAR_TOKEN_FILE, its
                # audience ds-sidecar), the assigner the other (issue 37).
                settings = connection()
                channel = open_channel(endpoint, settings.with_tls(settings.tls.for_sidecars()))
                self._channels[endpoint] = channel
            return stream_pb2_grpc.StreamServiceStub(channel)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()


@dataclass(frozen=True)
class Mesh:
    """What a read or a commit needs: the group, how to reach the assigner, the channels."""

    group: str
    client_id: str
    assigner: AssignerClient
    sidecars: SidecarPool

    def close(self) -> None:
        self.assigner.close()
        self.sidecars.close()


# Executors read many ranges per Python worker process: reuse clients across tasks.
_SHARED: dict[tuple[tuple[str, ...], str | None, str, str], Mesh] = {}
_SHARED_LOCK = threading.Lock()


def shared_mesh(addresses: Sequence[str], consul: str | None, group: str, client_id: str) -> Mesh:
    key = (tuple(addresses), consul, group, client_id)
    with _SHARED_LOCK:
        mesh = _SHARED.get(key)
        if mesh is None:
            mesh = Mesh(group, client_id, AssignerClient(addresses, consul), SidecarPool())
            _SHARED[key] = mesh
        return mesh


@dataclass(frozen=True)
class ReadSpec:
    """One input partition: ``[from_offset, to_offset)`` of a partition."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int
    endpoint: str | None  # where the planner saw the lease; None = ask the assigner
    from_earliest: bool = False  # the range starts at "the beginning": a log start above
    # from_offset is not data loss (a new partition, startingOffsets=earliest)


@dataclass(frozen=True)
class ReadPolicy:
    chunk_bytes: int
    read_timeout: float  # give up after this long without progress
    fail_on_data_loss: bool
    arrow: bool = True  # ask for ARROW_IPC chunks; records from sidecars that refuse it


@dataclass(frozen=True)
class ReadChunk:
    """One ReadRange response: records, or an Arrow IPC stream of them (columns as in
    stream.proto's READ_FORMAT_ARROW_IPC), starting at or after ``start``."""

    start: int
    records: Sequence[common_pb2.Record]
    arrow_ipc: bytes


class _Follower:
    """Finds the current owner of one partition, backing off between attempts, and gives
    up once ``timeout`` passes without progress."""

    def __init__(self, mesh: Mesh, tp: TP, endpoint: str | None, timeout: float) -> None:
        self.mesh = mesh
        self.tp = tp
        self.endpoint = endpoint
        self.timeout = timeout
        self.last_progress = time.monotonic()
        self.backoff = 0.05
        self.last_error = ""

    def progressed(self) -> None:
        self.last_progress = time.monotonic()
        self.backoff = 0.05

    def owner(self) -> str:
        while self.endpoint is None:
            self._check_deadline()
            view = self.mesh.assigner.describe(self.mesh.group, timeout=self.timeout)
            self.endpoint = view.endpoint_of(self.tp)
            if self.endpoint is None:
                self.last_error = "no sidecar holds the partition"
                self._sleep()
        return self.endpoint

    def moved(self, err: grpc.RpcError) -> None:
        """The owner failed with a retriable status: look it up again after a pause."""
        self.last_error = f"{self.endpoint}: {_describe_error(err)}"
        log.warning(
            "%s[%d]: owner unavailable, asking the assigner again: %s",
            self.tp[0],
            self.tp[1],
            self.last_error,
        )
        self.endpoint = None
        self._check_deadline()
        self._sleep()

    def _sleep(self) -> None:
        time.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, 1.0)

    def _check_deadline(self) -> None:
        if time.monotonic() - self.last_progress > self.timeout:
            raise MeshError(
                f"{self.tp[0]}[{self.tp[1]}]: no sidecar served the partition for "
                f"{self.timeout:.0f} s (last: {self.last_error or 'none'})"
            )


def _retriable(err: grpc.RpcError) -> bool:
    return err.code() in RETRY_CODES or _reason(err) in MOVED_REASONS


def _refuses_arrow(err: grpc.RpcError) -> bool:
    """INVALID_ARGUMENT on the ``format`` field: a sidecar without ARROW_IPC support."""
    info = error_info(err)
    return (
        err.code() == grpc.StatusCode.INVALID_ARGUMENT
        and info is not None
        and info.metadata.get("field") == "format"
    )


def read_range(mesh: Mesh, spec: ReadSpec, policy: ReadPolicy) -> Iterator[ReadChunk]:
    """``spec``'s range in offset order, in the sidecar's chunks; each record exactly once,
    following lease moves. Raises :class:`MeshError` when no owner serves the partition
    for ``policy.read_timeout`` and :class:`DataLossError` when the range is gone from
    Kafka (unless the policy allows skipping)."""
    tp = TP(spec.topic, spec.partition)
    position = spec.from_offset
    follower = _Follower(mesh, tp, spec.endpoint, policy.read_timeout)
    while position < spec.to_offset:
        endpoint = follower.owner()
        arrow = policy.arrow and mesh.sidecars.takes_arrow(endpoint)
        request = stream_pb2.ReadRangeRequest(
            client_id=mesh.client_id,
            group=mesh.group,
            topic=spec.topic,
            partition=spec.partition,
            from_offset=position,
            to_offset=spec.to_offset,
            max_bytes=policy.chunk_bytes,
            format=stream_pb2.READ_FORMAT_ARROW_IPC if arrow else stream_pb2.READ_FORMAT_RECORDS,
        )
        try:
            stream = mesh.sidecars.stub(endpoint).ReadRange(request, timeout=policy.read_timeout)
            for response in stream:
                records = response.records
                if records and records[0].offset < position:
                    raise MeshError(
                        f"{spec.topic}[{spec.partition}]: the sidecar returned offset "
                        f"{records[0].offset} below {position}"
                    )
                if records or response.arrow_ipc:
                    yield ReadChunk(position, records, response.arrow_ipc)
                if response.next_offset > position:
                    position = response.next_offset
                    follower.progressed()
        except grpc.RpcError as err:
            if arrow and _refuses_arrow(err):
                mesh.sidecars.arrow_refused(endpoint)  # validated before reading: retry now
                continue
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                position = _after_out_of_range(err, spec, position, policy)
                follower.progressed()
                continue
            if not _retriable(err):
                raise MeshError(
                    f"ReadRange {spec.topic}[{spec.partition}] [{position}, {spec.to_offset}) "
                    f"on {endpoint}: {_describe_error(err)}"
                ) from err
            follower.moved(err)


def _after_out_of_range(
    err: grpc.RpcError, spec: ReadSpec, position: int, policy: ReadPolicy
) -> int:
    """Where to go on after an OUT_OF_RANGE: the log start, when records below it were
    deleted and that is allowed; otherwise the range is lost."""
    info = error_info(err)
    metadata = dict(info.metadata) if info is not None else {}
    try:
        log_start = int(metadata.get("log_start_offset", "-1"))
        high = int(metadata.get("high_watermark", "-1"))
    except ValueError:
        log_start = high = -1
    if 0 <= high < spec.to_offset:
        raise DataLossError(
            f"{spec.topic}[{spec.partition}]: the log ends at {high}, below the planned end "
            f"{spec.to_offset} (was the topic recreated?)"
        ) from err
    if log_start > position:
        if spec.from_earliest or not policy.fail_on_data_loss:
            if not spec.from_earliest:
                log.warning(
                    "%s[%d]: offsets [%d, %d) were deleted before they were read; skipping",
                    spec.topic,
                    spec.partition,
                    position,
                    min(log_start, spec.to_offset),
                )
            return min(log_start, spec.to_offset)
        raise DataLossError(
            f"{spec.topic}[{spec.partition}]: offsets [{position}, {log_start}) were deleted "
            "before they were read (set failOnDataLoss=false to skip them)"
        ) from err
    raise MeshError(
        f"ReadRange {spec.topic}[{spec.partition}] [{position}, {spec.to_offset}): "
        f"{_describe_error(err)}"
    ) from err


def log_start_offset(mesh: Mesh, tp: TP, endpoint: str | None, timeout: float) -> int:
    """The partition's log start offset, asked of its owner with an always-out-of-range
    ReadRange (the sidecar validates a range against the log before reading anything)."""
    follower = _Follower(mesh, tp, endpoint, timeout)
    request = stream_pb2.ReadRangeRequest(
        client_id=mesh.client_id,
        group=mesh.group,
        topic=tp[0],
        partition=tp[1],
        from_offset=0,
        to_offset=PROBE_TO_OFFSET,
        max_bytes=1024,
        format=stream_pb2.READ_FORMAT_RECORDS,
    )
    while True:
        owner = follower.owner()
        try:
            for _ in mesh.sidecars.stub(owner).ReadRange(request, timeout=CALL_TIMEOUT_SECONDS):
                pass
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                info = error_info(err)
                if info is not None and "log_start_offset" in info.metadata:
                    return int(info.metadata["log_start_offset"])
            if not _retriable(err):
                raise MeshError(
                    f"log start of {tp[0]}[{tp[1]}] on {owner}: {_describe_error(err)}"
                ) from err
            follower.moved(err)
            continue
        raise MeshError(f"log start of {tp[0]}[{tp[1]}]: {owner} read a range beyond any log")


@dataclass(frozen=True)
class Holder:
    endpoint: str
    epoch: int
    committed: int | None = None  # the partition's committed offset there (its Status)


def live_holders(mesh: Mesh, view: GroupView) -> dict[TP, Holder]:
    """Who serves each partition right now, by the sidecars' own ``Status``: a partition
    whose local lease deadline has not passed, at the highest epoch if two claim it.
    A member that does not answer is skipped; the assigner's view fills the gaps."""
    holders: dict[TP, Holder] = {}
    for endpoint in sorted(set(view.members.values())):
        try:
            status = mesh.sidecars.stub(endpoint).Status(
                stream_pb2.StatusRequest(), timeout=CALL_TIMEOUT_SECONDS
            )
        except grpc.RpcError:
            continue
        if status.group != mesh.group:
            continue
        for part in status.partitions:
            remaining = part.lease_deadline_remaining
            if remaining.seconds <= 0 and remaining.nanos <= 0:
                continue
            tp = TP(part.topic, part.partition)
            known = holders.get(tp)
            if known is None or part.lease_epoch > known.epoch:
                holders[tp] = Holder(endpoint, part.lease_epoch, part.committed_offset)
    for tp, lease in view.leases.items():
        assigned = view.endpoint_of(tp)
        if tp not in holders and assigned is not None:
            holders[tp] = Holder(assigned, lease.epoch)
    return holders


def prove_read(mesh: Mesh, tp: TP, holder: Holder, offset: int, timeout: float) -> int:
    """Read ``[committed, offset)`` of ``tp`` again through ``holder``, discarding it, so
    that it accepts a commit of ``offset``: a sidecar takes a commit only from the client
    its ReadRange gave every record up to it, under its own lease epoch (range_reads.py).
    Spark read these records through an earlier holder (they are in its checkpoint) and
    commits later; when that holder died in between, the new one gave the reader nothing.
    Returns how many records were read; raises ``grpc.RpcError`` as ReadRange does."""
    if holder.committed is None or holder.committed < 0 or offset <= holder.committed:
        return 0
    request = stream_pb2.ReadRangeRequest(
        client_id=mesh.client_id,
        group=mesh.group,
        topic=tp[0],
        partition=tp[1],
        from_offset=holder.committed,
        to_offset=offset,
        max_bytes=PROVE_CHUNK_BYTES,
        format=stream_pb2.READ_FORMAT_RECORDS,
    )
    read = 0
    for response in mesh.sidecars.stub(holder.endpoint).ReadRange(request, timeout=timeout):
        read += len(response.records)
    log.info(
        "%s[%d]: read [%d, %d) again through %s (epoch %d) before committing it: "
        "%d records (the lease moved since Spark read them)",
        tp[0], tp[1], holder.committed, offset, holder.endpoint, holder.epoch, read,
    )  # fmt: skip
    return read


def commit_offsets(
    mesh: Mesh,
    offsets: Mapping[TP, int],
    timeout: float,
    describe: Callable[[], GroupView] | None = None,
) -> dict[TP, str]:
    """Commit ``offsets`` to the group through the sidecars holding the partitions now,
    each under the holder's current lease epoch; retried while leases move, for up to
    ``timeout``. Returns what could not be committed, with why (empty = all committed)."""
    pending: dict[TP, str] = {tp: "not tried" for tp in offsets}
    proven: set[tuple[TP, str, int]] = set()  # (partition, holder, epoch) read again
    deadline = time.monotonic() + timeout
    backoff = 0.1
    while True:
        unproven: list[tuple[TP, Holder]] = []
        view = describe() if describe is not None else mesh.assigner.describe(mesh.group)
        holders = live_holders(mesh, view)
        by_endpoint: dict[str, list[stream_pb2.OffsetCommit]] = {}
        for tp in sorted(pending):
            holder = holders.get(tp)
            if holder is None:
                pending[tp] = "no sidecar holds the partition"
                continue
            by_endpoint.setdefault(holder.endpoint, []).append(
                stream_pb2.OffsetCommit(
                    topic=tp[0], partition=tp[1], offset=offsets[tp], lease_epoch=holder.epoch
                )
            )
        for endpoint, commits in by_endpoint.items():
            request = stream_pb2.CommitOffsetsRequest(
                client_id=mesh.client_id, group=mesh.group, offsets=commits
            )
            try:
                response = mesh.sidecars.stub(endpoint).CommitOffsets(
                    request, timeout=CALL_TIMEOUT_SECONDS
                )
            except grpc.RpcError as err:
                if not _retriable(err):
                    raise MeshError(f"CommitOffsets on {endpoint}: {_describe_error(err)}") from err
                for commit in commits:
                    pending[TP(commit.topic, commit.partition)] = _describe_error(err)
                continue
            for result in response.results:
                tp = TP(result.commit.topic, result.commit.partition)
                if result.committed:
                    pending.pop(tp, None)
                    continue
                reason = stream_pb2.RejectReason.Name(result.reason)
                pending[tp] = f"{reason}: {result.message}"
                holder = holders[tp]
                if (
                    result.reason == stream_pb2.REJECT_REASON_NOT_DELIVERED
                    and (tp, holder.endpoint, holder.epoch) not in proven
                ):
                    unproven.append((tp, holder))
        read_again = False
        for tp, holder in unproven:
            try:
                left = max(CALL_TIMEOUT_SECONDS, deadline - time.monotonic())
                prove_read(mesh, tp, holder, offsets[tp], left)
            except grpc.RpcError as err:  # e.g. the new holder not serving yet: next round
                pending[tp] += f"; reading it again on {holder.endpoint}: {_describe_error(err)}"
                continue
            proven.add((tp, holder.endpoint, holder.epoch))
            read_again = True
        if not pending or time.monotonic() + backoff > deadline:
            return pending
        if not read_again:  # read again: commit at once; else wait for the leases to settle
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
