"""The assigner's three servicers on an in-process grpc.aio server (port 0), for the
``test_rpc_*`` unit tests.

Everything above Kafka is real: :class:`GroupRegistry` with real :class:`GroupRuntime`
groups and coordinators, the :class:`OffsetsView` cache, the idempotency cache, page
tokens, the error interceptor. Only Kafka is replaced, at the narrow objects the app would
wire to it: topic metadata and classic group members (:class:`MemoryKafka`, which reads
real confluent-kafka ``ClusterMetadata`` through :func:`partitions_of`), the durable state
writes (:class:`MemoryStore`) and the offsets reads, offsets-for-times and reset commits
(:class:`MemoryOffsets`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from confluent_kafka import KafkaException
from confluent_kafka.admin import ClusterMetadata, PartitionMetadata, TopicMetadata
from prometheus_client import CollectorRegistry

from dataservice.assigner.v1 import (
    admin_pb2_grpc,
    assigner_pb2,
    assigner_pb2_grpc,
    binding_pb2_grpc,
    types_pb2,
)
from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason, error_info
from services.assigner.admission import AdmissionPolicy, JoinAdmission
from services.assigner.external_resets import ExternalResets
from services.assigner.kafka_cluster import partitions_of
from services.assigner.metrics import AssignerMetrics
from services.assigner.offsets import Offsets, PartitionOffsets, unavailable
from services.assigner.offsets_view import OffsetsView
from services.assigner.registry import GroupRegistry
from services.assigner.resets import OffsetResets
from services.assigner.rpc import AdminServicer, AssignerServicer, BindingServicer
from services.assigner.settings import AssignerSettings
from services.assigner.state import GroupRecord
from services.runtime.auth import AuthSettings, build_guard
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.topic_partition import TopicPartition
from tests.unit.auth_support import as_identity

TOPIC = "orders.v1"


class MemoryKafka:
    """Topics (name -> partition count) and classic consumer groups (name -> members)."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        self.topics = dict(topics)
        self.members: dict[str, int] = {}
        self.down = False

    async def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        self._reachable()
        return partitions_of(self._metadata(), topics)

    async def group_members(self, group: str) -> int:
        self._reachable()
        return self.members.get(group, 0)

    def _reachable(self) -> None:
        if self.down:
            raise DsError(Reason.KAFKA_UNAVAILABLE, "cannot read Kafka metadata: broker down")

    def _metadata(self) -> ClusterMetadata:
        metadata = ClusterMetadata()
        for name, count in self.topics.items():
            topic = TopicMetadata()
            topic.topic = name
            for p in range(count):
                partition = PartitionMetadata()
                partition.id = p
                topic.partitions[p] = partition
            metadata.topics[name] = topic
        return metadata


@dataclass
class MemoryStore:
    """The state topic's writes, acknowledged at once (or refused while ``failing``).

    While ``holding_epochs``, epoch writes stay pending in ``held`` (a slow broker) until
    the test settles them."""

    writes: list[tuple[str, ...]] = field(default_factory=list)
    records: dict[str, GroupRecord] = field(default_factory=dict)
    failing: bool = False
    holding_epochs: bool = False
    held: list[asyncio.Future[None]] = field(default_factory=list)

    def put_group(self, record: GroupRecord) -> asyncio.Future[None]:
        if not self.failing:
            self.records[record.name] = record
        return self._ack("group", record.name, str(record.config_version))

    def put_epochs(
        self,
        group: str,
        epochs: Iterable[tuple[TopicPartition, int]],
        holders: Mapping[TopicPartition, str] | None = None,
    ) -> asyncio.Future[None]:
        if self.holding_epochs:
            self.held.append(asyncio.get_running_loop().create_future())
            return self.held[-1]
        return self._ack("epochs", group, *(f"{tp.topic}/{tp.partition}@{e}" for tp, e in epochs))

    def put_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._ack("binding", group, client_id)

    def delete_binding(self, group: str, client_id: str) -> asyncio.Future[None]:
        return self._ack("unbinding", group, client_id)

    def put_drain(self, group: str, sidecar_id: str, drained: bool) -> asyncio.Future[None]:
        return self._ack("drain" if drained else "undrain", group, sidecar_id)

    def delete_group(
        self, group: str, clients: Iterable[str], drained: Iterable[str]
    ) -> asyncio.Future[None]:
        if not self.failing:
            self.records.pop(group, None)
        return self._ack("delete", group, *sorted(clients), *sorted(drained))

    def _ack(self, *write: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failing:
            future.set_exception(KafkaException("state topic: broker down"))
        else:
            self.writes.append(write)
            future.set_result(None)
        return future


@dataclass
class MemoryOffsets:
    """Committed offsets per (group, partition) and log bounds per partition."""

    committed: dict[tuple[str, TopicPartition], int] = field(default_factory=dict)
    bounds: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    timestamps: dict[tuple[TopicPartition, int], int] = field(default_factory=dict)
    by_time: dict[TopicPartition, int] = field(default_factory=dict)  # offsets-for-times
    commits: list[tuple[str, dict[TopicPartition, tuple[int, int]]]] = field(default_factory=list)
    down: bool = False

    def read(self, group: str, partitions: Sequence[TopicPartition]) -> Offsets:
        if self.down:
            raise unavailable(f"cannot read committed offsets of group {group!r}", group)
        return {
            tp: PartitionOffsets(
                committed=self.committed.get((group, tp), -1),
                earliest=self.bounds.get(tp, (0, 0))[0],
                end=self.bounds.get(tp, (0, 0))[1],
            )
            for tp in partitions
        }

    def read_many(
        self, groups: Mapping[str, Sequence[TopicPartition]]
    ) -> dict[str, Offsets | DsError]:
        out: dict[str, Offsets | DsError] = {}
        for group, tps in groups.items():
            try:
                out[group] = self.read(group, tps)
            except DsError as err:
                out[group] = err
        return out

    def oldest_timestamps(self, starts: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        return {
            tp: self.timestamps[(tp, o)] for tp, o in starts.items() if (tp, o) in self.timestamps
        }

    def offsets_for_times(self, times: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        return {tp: self.by_time.get(tp, -1) for tp in times}

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, int]],
        *,
        fence_leases: bool = False,
    ) -> None:
        """A reset's commit: (offset, epoch) per partition, as Kafka would keep it (no
        producer holds a lease's transactional id here: ``fence_leases`` has no one to
        fence)."""
        if self.down:
            raise unavailable(f"cannot commit the new offsets of group {group!r}", group)
        self.commits.append((group, dict(offsets)))
        for tp, (offset, _epoch) in offsets.items():
            self.committed[(group, tp)] = offset

    def close(self) -> None:
        pass


@dataclass
class Assigner:
    """One running servicer set and what it is wired to."""

    settings: AssignerSettings
    groups: GroupRegistry
    kafka: MemoryKafka
    store: MemoryStore
    offsets: MemoryOffsets
    metrics: AssignerMetrics
    prometheus: CollectorRegistry
    sessions: assigner_pb2_grpc.AssignerServiceAsyncStub  # on the grpc.aio channel
    bindings: binding_pb2_grpc.BindingServiceStub
    admin: admin_pb2_grpc.AdminServiceStub
    leader: list[bool]
    address: str = ""  # host:port of the in-process server

    async def create(
        self, name: str, topics: Sequence[str] = (TOPIC,), mode: str = "leased"
    ) -> None:
        """A group as CreateGroup would leave it (through the registry, not the RPC)."""
        await self.groups.create_group(GroupRecord(name=name, topics=list(topics), mode=mode))


Body = Callable[[Assigner], Awaitable[None]]


def run(
    body: Body,
    *,
    topics: Mapping[str, int] | None = None,
    serving: bool = True,
    settings: AssignerSettings | None = None,
    timeout: float = 20.0,
    auth: AuthSettings | None = None,
) -> None:
    """Start the servicers on port 0, run ``body`` against them, stop. With ``auth``, behind
    the authorization interceptor (callers pass ``as_identity``'s metadata)."""

    async def main() -> None:
        the_settings = settings or AssignerSettings(grpc_port=0, http_port=0)
        kafka = MemoryKafka(topics if topics is not None else {TOPIC: 4})
        store, offsets = MemoryStore(), MemoryOffsets()
        prometheus = CollectorRegistry()
        metrics = AssignerMetrics(prometheus)
        leader = [serving]
        groups = GroupRegistry(the_settings, metrics, store, kafka, is_leader=lambda: leader[0])
        if serving:
            groups.start_serving()
        view = OffsetsView(offsets)
        resets = OffsetResets(offsets, kafka)
        external = ExternalResets(resets, groups.get)
        guard = build_guard(auth, prometheus, "ds-assigner") if auth is not None else None
        server = create_server(
            the_settings,
            [
                GrpcService(
                    "dataservice.assigner.v1.AssignerService",
                    AssignerServicer(
                        groups,
                        metrics,
                        external=external,
                        admission=JoinAdmission(
                            AdmissionPolicy(
                                rate=the_settings.join_rate,
                                burst=the_settings.join_burst,
                                max_retry_after=the_settings.join_max_retry_after_seconds,
                            ),
                            time.monotonic(),
                        ),
                    ),
                    assigner_pb2_grpc.add_AssignerServiceServicer_to_server,
                ),
                GrpcService(
                    "dataservice.assigner.v1.BindingService",
                    BindingServicer(groups),
                    binding_pb2_grpc.add_BindingServiceServicer_to_server,
                ),
                GrpcService(
                    "dataservice.assigner.v1.AdminService",
                    AdminServicer(groups, view, kafka, the_settings, resets=resets),
                    admin_pb2_grpc.add_AdminServiceServicer_to_server,
                ),
            ],
            auth=guard.interceptor() if guard is not None else None,
        )
        await server.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                assigner = Assigner(
                    settings=the_settings,
                    groups=groups,
                    kafka=kafka,
                    store=store,
                    offsets=offsets,
                    metrics=metrics,
                    prometheus=prometheus,
                    sessions=assigner_pb2_grpc.AssignerServiceStub(channel),
                    bindings=binding_pb2_grpc.BindingServiceStub(channel),
                    admin=admin_pb2_grpc.AdminServiceStub(channel),
                    leader=leader,
                    address=f"127.0.0.1:{server.port}",
                )
                await asyncio.wait_for(body(assigner), timeout)
        finally:
            groups.stop_serving()
            groups.clear()
            await server.server.stop(0)

    asyncio.run(main())


# ---- calls and their errors --------------------------------------------------------------


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error a unary call (or a stream's first read) ends with."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err
    raise AssertionError("the call succeeded")


async def stream_refused(call: Any) -> grpc.aio.AioRpcError:
    """The error a streaming call ends with (read through ``call.read()``), within 10 s."""
    try:
        # grpc-stubs lack grpc.aio.EOF (the stream's end marker), hence the ignore
        while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            pass
    except grpc.aio.AioRpcError as err:
        return err
    raise AssertionError("the stream ended without an error")


def reason_of(err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """(status code, ErrorInfo reason, ErrorInfo metadata)."""
    info = error_info(err)
    assert info is not None, err
    assert info.domain == "dataservice"
    return err.code(), info.reason, dict(info.metadata)


def field_error(err: grpc.aio.AioRpcError) -> str:
    """The field an INVALID_ARGUMENT INVALID_FIELD names."""
    code, reason, metadata = reason_of(err)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"), err
    return metadata["field"]


# ---- a sidecar's Session -----------------------------------------------------------------


def join(
    sidecar_id: str,
    group: str,
    *,
    endpoint: str | None = None,
    capacity: int = 0,
) -> assigner_pb2.SessionRequest:
    return assigner_pb2.SessionRequest(
        join=assigner_pb2.SessionJoin(
            sidecar_id=sidecar_id,
            group=group,
            endpoint=f"{sidecar_id}.pod:7080" if endpoint is None else endpoint,
            capacity=capacity,
        )
    )


class Sidecar:
    """A sidecar's side of one Session stream."""

    def __init__(
        self,
        stub: assigner_pb2_grpc.AssignerServiceAsyncStub,
        sidecar_id: str,
        *,
        identity: str | None = None,
        metadata: Sequence[tuple[str, str]] | None = None,
        endpoint: str | None = None,
    ) -> None:
        """``identity``: a static test identity (:func:`as_identity`), or ``metadata`` as
        it is (a bearer token of another kind); ``endpoint``: what its join advertises."""
        self.id = sidecar_id
        self.endpoint = endpoint
        self.call = stub.Session(
            None,  # requests written with call.write (grpc's default; the stubs have none)
            metadata=as_identity(identity) if identity else (tuple(metadata or ()) or None),
        )
        self.seq = 0

    async def join(self, group: str) -> assigner_pb2.SessionAccepted:
        await self.call.write(join(self.id, group, endpoint=self.endpoint))
        first = await self.next()
        assert first.WhichOneof("kind") == "accepted", first
        return first.accepted

    async def next(self, timeout: float = 5.0) -> assigner_pb2.SessionResponse:
        message = await asyncio.wait_for(self.call.read(), timeout)
        # grpc-stubs lack grpc.aio.EOF (the stream's end marker), hence the ignore
        ended = message is grpc.aio.EOF  # type: ignore[attr-defined]
        assert not ended, "the assigner ended the session"
        assert isinstance(message, assigner_pb2.SessionResponse)
        return message

    async def grants(self, count: int) -> list[assigner_pb2.LeaseGrant]:
        out: list[assigner_pb2.LeaseGrant] = []
        while len(out) < count:
            message = await self.next()
            if message.WhichOneof("kind") == "grant":
                out.append(message.grant)
        return out

    async def heartbeat(
        self, grants: Iterable[assigner_pb2.LeaseGrant], *, applied_config_version: int = 0
    ) -> assigner_pb2.HeartbeatAck:
        self.seq += 1
        await self.call.write(
            assigner_pb2.SessionRequest(
                heartbeat=assigner_pb2.SessionHeartbeat(
                    seq=self.seq,
                    applied_config_version=applied_config_version,
                    leases=[
                        assigner_pb2.LeaseProgress(
                            topic=g.topic, partition=g.partition, epoch=g.epoch
                        )
                        for g in grants
                    ],
                )
            )
        )
        while True:
            message = await self.next()
            if message.WhichOneof("kind") == "heartbeat_ack":
                return message.heartbeat_ack

    async def close(self) -> None:
        await self.call.done_writing()
        self.call.cancel()


def leased_config(name: str, *topics: str, **fields: Any) -> types_pb2.GroupConfig:
    return types_pb2.GroupConfig(
        name=name,
        topics=list(topics or (TOPIC,)),
        mode=common_pb2.GROUP_MODE_LEASED,
        **fields,
    )
