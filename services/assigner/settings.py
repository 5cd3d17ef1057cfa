"""Assigner settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.runtime.consumer_config import ConsumerConfigError, validate
from services.runtime.settings import ServiceSettings


class GroupSeed(BaseModel):
    """A group declared in the config file; created at start if it does not exist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The group's name (also its Kafka consumer group id).
    name: str = Field(min_length=1, max_length=249)
    # The topics the group consumes.
    topics: list[str] = Field(min_length=1)
    # leased (sidecars lease partitions from the assigner) or kafka_group (classic subscribe()).
    mode: Literal["leased", "kafka_group"] = "leased"
    # librdkafka consumer settings for the group, checked against the allow-list.
    consumer_config: dict[str, str] = Field(default_factory=dict)
    # count (even partition counts) or load (weighted by the bytes/s and lag sidecars report).
    balance_strategy: Literal["count", "load"] = "count"
    # Redelivery: unset / 0 = the sidecars' defaults (30 s, 10); max_deliveries -1 = never.
    visibility_timeout_seconds: float | None = Field(None, ge=1, le=43_200)
    # Deliveries of a record before it is given up as POISON_RECORD (0 = the sidecars' default, -1 =
    # never).
    max_deliveries: int = Field(0, ge=-1, le=1_000_000)
    # A committed offset the mesh did not write (kafka-consumer-groups --reset-offsets).
    external_offset_changes: Literal["follow", "revert", "ignore"] = "follow"
    # The group's dead-letter topic (records given up past max_deliveries go there before
    # they are committed past); "" = the sidecars' dead_letter_topic setting.
    dead_letter_topic: str = Field("", max_length=249, pattern=r"^[A-Za-z0-9._-]*$")
    # Which records may be in flight to the group's clients at once (issue 39).
    ordering: Literal["unordered", "key", "partition"] = "unordered"
    # How commits are fenced (issue 36); "" = each sidecar's commit_fencing setting.
    commit_fencing: Literal["", "lease", "kafka"] = ""

    @field_validator("consumer_config")
    @classmethod
    def _allowed_consumer_config(cls, value: dict[str, str]) -> dict[str, str]:
        """The same rules as CreateGroup's: the allow-list, then librdkafka's verdict."""
        try:
            validate(value)
        except ConsumerConfigError as err:
            raise ValueError(err.message) from None
        return value


class AssignerSettings(ServiceSettings):
    grpc_port: int = Field(7070, ge=0, le=65535)
    http_port: int = Field(7071, ge=0, le=65535)
    # How long a lease lives without a renewal; each acknowledged heartbeat renews it. The sidecar
    # stops at its local deadline (TTL - margin), the assigner reassigns after TTL + grace.
    lease_ttl_seconds: float = Field(3.0, ge=0.5, le=300)
    # How often sidecars send Session heartbeats (at most half the TTL, so one late heartbeat does
    # not expire every lease).
    heartbeat_interval_seconds: float = Field(1.0, ge=0.05, le=60)
    # Admission of Session joins (services/assigner/admission.py): at most join_rate new joins
    # a second, join_burst at once; the rest are refused with a retry-after (JOIN_THROTTLED) of
    # at most join_max_retry_after_seconds. Heartbeats and re-attaches with held leases are
    # never refused. 0 = no limit. 50/s and 100 at once: a storm at twice the capacity cost
    # attached sidecars nothing at 50/s and their leases at 100/s on a loaded 2-core machine
    # (tests/bench/bench_join_storm.py, docs/operate/failure-model.md).
    join_rate: float = Field(50.0, ge=0, le=100_000)
    join_burst: int = Field(100, ge=1, le=1_000_000)
    join_max_retry_after_seconds: float = Field(10.0, gt=0, le=600)
    # Heartbeats before joins: while the event loop runs later than this (seconds; its
    # heartbeat acks are late), every new join is refused with a retry-after whatever
    # join_rate allows. 0 = off.
    join_max_loop_lag_seconds: float = Field(1.0, ge=0, le=60)
    # What the assigner waits past a lease's TTL before it may grant the partition elsewhere.
    lease_grace_seconds: float = Field(1.0, ge=0.1, le=60)
    # A sidecar whose Session stream ended without a Leave (its kernel closes a killed
    # process's socket at once) is gone if it does not attach again within this long; its
    # leases whose commits Kafka fences (commit_fencing: kafka) then move at once instead
    # of at TTL + grace. Other leases keep their expiry.
    lease_reconnect_window_seconds: float = Field(1.0, ge=0, le=60)
    # How long a revoked holder waits for in-flight acks before it commits and releases (and a mode
    # switch waits for the sidecars to hand over).
    drain_timeout_seconds: float = Field(5.0, ge=0, le=300)
    hold_window_seconds: float = Field(
        10.0,
        ge=0,
        le=600,
        description="static identity: how long a gracefully-left "
        "sidecar's partitions are kept for it (0 = hand them off at once)",
    )
    hold_mode: Literal["reserve", "handoff"] = Field(
        "handoff",
        description="what a gracefully-left sidecar's partitions do during its hold window: "
        "handoff (default) = go to the other sidecars at once and come back to it by "
        "cooperative handoffs if it returns in time (no gap; each moves twice); "
        "reserve = wait for it, unread (nothing moves; a restart leaves them unconsumed "
        "until it is back or the window ends)",
    )
    # The compacted topic the assigner's state (groups, epochs, bindings, drains) is written to and
    # rebuilt from.
    state_topic: str = Field("__ds_assigner_state", min_length=1, max_length=249)
    state_transactional_id: str = Field(
        "ds-assigner-state",
        min_length=1,
        max_length=249,
        description="the transactional.id every replica of this assigner cluster writes the "
        "state topic under: a new leader's term fences the previous leader's writes",
    )
    state_write_timeout_seconds: float = Field(
        5.0,
        ge=0.5,
        le=300,
        description="how long a grant waits for its epoch to be written to the state topic; "
        "a grant whose write fails or times out is taken back and decided again",
    )
    # The shortest time between two coordinator ticks (lease expiries, hold windows, rebalancing
    # when something changed): events within it share one tick and one rebalance. An idle
    # assigner ticks only at its next deadline, at least once a second (tick_wake.py).
    tick_seconds: float = Field(0.1, ge=0.01, le=5)
    # How often topic metadata is read again, so partitions added to a topic are picked up without a
    # restart.
    metadata_refresh_seconds: float = Field(10.0, ge=0.5, le=600)
    # Groups declared in the config file, created at start if they do not exist.
    groups: list[GroupSeed] = Field(default_factory=list)
    max_clients_per_group: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="bound clients per group (Bind past it: RESOURCE_EXHAUSTED TOO_MANY_CLIENTS)",
    )
    binding_liveness_seconds: float = Field(
        120.0,
        ge=0.1,
        le=86_400,
        description="a client's binding expires (is unbound) when nothing renewed it for "
        "this long: no open WatchBinding stream of it, no Bind, no sidecar reporting it",
    )
    max_watchers_per_group: int = Field(
        10_000, ge=1, le=10_000_000, description="open WatchBinding streams per group"
    )
    watch_queue_max: int = Field(
        64,
        ge=1,
        le=100_000,
        description="bindings queued for one WatchBinding stream; a watcher that falls this "
        "far behind is dropped (WATCHER_TOO_SLOW) and must watch again",
    )

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> AssignerSettings:
        if self.heartbeat_interval_seconds * 2 > self.lease_ttl_seconds:
            raise ValueError(
                "heartbeat_interval_seconds must be at most half of lease_ttl_seconds, "
                "or a single late heartbeat expires every lease"
            )
        return self
