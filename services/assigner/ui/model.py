"""What each page shows: plain frozen data, built by :mod:`.gather`, rendered by :mod:`.render`."""

from __future__ import annotations

from dataclasses import dataclass

from services.assigner.client_activity import ClientRow


@dataclass(frozen=True)
class Page:
    """What every page carries: who serves it and when the data was read."""

    instance: str  # this assigner's advertised gRPC address
    generated_at: str  # wall-clock time, ISO 8601 UTC
    refresh_seconds: int = 5


@dataclass(frozen=True)
class NotLeader:
    """A follower shows who leads instead of data it does not have."""

    page: Page
    leader_address: str | None  # gRPC HOST:PORT of the leader; None = no leader known
    leader_ui: str | None  # the leader's /ui URL when its HTTP port is known


@dataclass(frozen=True)
class GroupSummary:
    name: str
    mode: str
    strategy: str
    sidecars: int
    partitions: int
    clients: int
    total_lag: int  # -1 = unknown


@dataclass(frozen=True)
class IndexView:
    page: Page
    groups: tuple[GroupSummary, ...]
    error: str = ""  # why lag is unknown, if it is


@dataclass(frozen=True)
class SidecarLoad:
    sidecar_id: str
    endpoint: str
    zone: str
    partitions: tuple[str, ...]  # "topic/partition", sorted
    bytes_per_second: float


@dataclass(frozen=True)
class BrokerLoad:
    broker_id: int
    host: str
    partitions: tuple[str, ...]  # the group's partitions this broker leads


@dataclass(frozen=True)
class GroupDistribution:
    name: str
    mode: str
    strategy: str
    sidecars: tuple[SidecarLoad, ...]
    brokers: tuple[BrokerLoad, ...]
    unassigned: tuple[str, ...]  # partitions no sidecar holds right now
    imbalance: float  # max / mean partitions per sidecar; 0 = no sidecar


@dataclass(frozen=True)
class DistributionView:
    page: Page
    groups: tuple[GroupDistribution, ...]
    broker_error: str = ""  # Kafka metadata could not be read


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    holder: str
    epoch: int
    state: str  # granted | revoking | free
    committed: int  # -1 = nothing committed
    end: int
    lag_records: int
    lag_seconds: float  # -1 = unknown
    status: str  # Burrow status name (OK, WARN, STALL, STOP, REWIND, NOTFOUND)
    trend: tuple[int, ...]  # lag samples, oldest first
    bytes_per_second: float
    # Who wrote the committed offset: a holder, a reset through the mesh, or an external
    # writer such as kafka-consumer-groups (commitmeta.committed_by); "" = nothing committed.
    committed_by: str = ""

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True)
class BindingRow:
    client_id: str
    sidecars: tuple[str, ...]  # "sidecar_id@address"


@dataclass(frozen=True)
class FaultRow:
    detected_at: str
    type: str
    state: str
    severity: str
    source: str
    message: str


@dataclass(frozen=True)
class Faults:
    rows: tuple[FaultRow, ...] = ()
    note: str = ""  # "notifier not configured", or why they could not be read


@dataclass(frozen=True)
class LagView:
    page: Page
    group: str
    status: str  # the group's worst status (Burrow: STOP, STALL, REWIND count as ERR)
    partitions: tuple[PartitionRow, ...]
    bindings: tuple[BindingRow, ...]
    faults: Faults
    sample_seconds: float

    @property
    def total_lag(self) -> int:
        return sum(p.lag_records for p in self.partitions)


@dataclass(frozen=True)
class Problem:
    """A page that cannot be shown (unknown group, Kafka unreachable)."""

    page: Page
    status: int
    title: str
    detail: str


@dataclass(frozen=True)
class ClientsView:
    """The application clients of one group (or of every group when ``group`` is empty)."""

    page: Page
    group: str
    clients: tuple[ClientRow, ...]
    now: float  # wall clock, for the ages shown
