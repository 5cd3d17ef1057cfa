"""Notifier settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dsclient.addresses import parse_host_port
from services.notifier.egress import EgressPolicy
from services.runtime.faults import parse_type
from services.runtime.settings import ServiceSettings


class LagThresholdSettings(BaseModel):
    """Lag thresholds of one group (0 = off). LAG_WARNING / LAG_ERROR open past them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # LAG_WARNING past this many records of lag.
    warn_records: int = Field(0, ge=0)
    # LAG_ERROR past this many records of lag.
    error_records: int = Field(0, ge=0)
    # LAG_WARNING past this lag in seconds.
    warn_seconds: float = Field(0.0, ge=0)
    # LAG_ERROR past this lag in seconds.
    error_seconds: float = Field(0.0, ge=0)


class LagSettings(BaseModel):
    """The lag evaluator (Burrow's rules; see services/runtime/lag.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Evaluate lag (off: no LAG_* faults and no group lag metrics).
    enabled: bool = True
    poll_seconds: float = Field(
        5.0, gt=0, le=600, description="high watermarks are read this often (batched)"
    )
    evaluate_seconds: float = Field(5.0, gt=0, le=600, description="groups evaluated this often")
    intervals: int = Field(10, ge=2, le=1000, description="commits in the sliding window")
    min_distance_seconds: float = Field(
        1.0, ge=0, le=3600, description="commits closer than this replace the newest one"
    )
    min_complete: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Burrow's minimum-complete: a partition whose window is less full is OK",
    )
    history_points: int = Field(360, ge=2, le=100_000, description="high-watermark samples")
    expire_group_seconds: float = Field(
        7 * 24 * 3600, gt=0, description="forget a group that has not committed for this long"
    )
    group_include: str = Field(".*", description="regex: groups evaluated")
    group_exclude: str = Field("^$", description="regex: groups never evaluated")
    thresholds: dict[str, LagThresholdSettings] = Field(
        default_factory=dict, description='per group name; "*" is the default for all'
    )

    @field_validator("group_include", "group_exclude")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value


class ProbeSettings(BaseModel):
    """The end-to-end delivery probe (services/notifier/probe.py): probe records produced to
    every partition of ``topic`` and consumed back through the mesh as group ``group``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False, description="run the probe (needs a sidecar serving the probe group)"
    )
    topic: str = Field("ds.probe", min_length=1, max_length=249, description="probe topic")
    group: str = Field(
        "ds-probe",
        min_length=1,
        max_length=200,
        description="leased group that consumes the probe topic (created if missing)",
    )
    partitions: int = Field(
        3, ge=1, le=1000, description="partitions of the probe topic when the probe creates it"
    )
    replication: int = Field(
        1, ge=1, le=7, description="replication factor of the probe topic when created"
    )
    interval_seconds: float = Field(
        5.0, gt=0, le=3600, description="one probe record per partition this often"
    )
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="a probe not consumed within this is counted lost"
    )
    assigner: str = Field(
        "127.0.0.1:7070",
        description="assigner HOST:PORT the probe consumer binds through (with --consul, "
        "the leader in Consul's KV is used instead)",
    )

    @field_validator("assigner")
    @classmethod
    def _valid_assigner(cls, value: str) -> str:
        parse_host_port(value, what="probe assigner address")
        return value


class ReportLimits(BaseModel):
    """What one ReportFault may carry; past any of it the report is INVALID_ARGUMENT
    (``field`` names what is too big). They keep every event well under Kafka's message
    size, so a report the notifier accepted can always be published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attributes: int = Field(64, ge=0, le=10_000, description="attributes per event")
    # Bytes of an attribute's key.
    max_attribute_key_bytes: int = Field(256, ge=1, le=64 * 1024)
    # Bytes of an attribute's value.
    max_attribute_value_bytes: int = Field(4096, ge=1, le=256 * 1024)
    max_partitions: int = Field(1024, ge=0, le=1_000_000, description="partitions per event")
    max_message_bytes: int = Field(4096, ge=1, le=256 * 1024, description="the message")
    max_event_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=512 * 1024,
        description="the whole event, serialized (Kafka's default message limit is 1 MB)",
    )


class AlertSettings(BaseModel):
    """What alert templates may do (services/notifier/egress.py, render_worker.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    webhook_egress: list[str] = Field(
        default_factory=list,
        description="hosts webhooks may POST to: a name, *.suffix, an address or network, "
        "each with an optional :port; private, loopback and link-local addresses only when "
        "allow-listed by address or network (default: none, no webhook is allowed)",
    )
    render_timeout_seconds: float = Field(
        1.0, gt=0, le=60, description="a render taking longer disables its template"
    )
    render_max_bytes: int = Field(
        64 * 1024, ge=1024, le=512 * 1024, description="a larger output disables its template"
    )
    render_memory_bytes: int = Field(
        512 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        le=16 * 1024**3,
        description="the render worker's address-space limit",
    )
    max_templates_per_caller: int = Field(
        100, ge=1, le=100_000, description="PutAlertTemplate of one more: RESOURCE_EXHAUSTED"
    )

    @field_validator("webhook_egress")
    @classmethod
    def _valid_entries(cls, value: list[str]) -> list[str]:
        EgressPolicy(value)  # raises ValueError naming a bad entry
        return value


class NotifierSettings(ServiceSettings):
    grpc_port: int = Field(7090, ge=0, le=65535)
    http_port: int = Field(7091, ge=0, le=65535)
    # The topic fault events are published to, keyed by group.
    faults_topic: str = Field("ds.faults", min_length=1, max_length=249)
    # Partitions of the faults topic when the notifier creates it.
    faults_topic_partitions: int = Field(6, ge=1, le=1000)
    # Replication factor of the faults topic when the notifier creates it.
    faults_topic_replication: int = Field(1, ge=1, le=7)
    fault_encoding: Literal["protobuf", "json"] = Field(
        "protobuf", description="how events are written to the faults topic"
    )
    recent_faults: int = Field(10_000, ge=100, le=1_000_000, description="kept for ListFaults")
    outbox_path: Path | None = Field(
        None,
        description="SQLite outbox (WAL); keep it on a volume. Default: "
        "$XDG_STATE_HOME (~/.local/state)/dataservice/notifier-outbox-<grpc port>.sqlite",
    )
    suppression_window_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="storm-suppression window per fault type (e.g. COMMIT_FAILED: 10); "
        '"*" for all; default from the catalogue',
    )
    # The compacted topic alert templates are stored in.
    templates_topic: str = Field("ds.alert_templates", min_length=1, max_length=249)
    # Rendered alerts go to topics with this prefix (ds.alerts.<caller>); routes may name no other
    # topic.
    alerts_topic_prefix: str = Field("ds.alerts.", min_length=1, max_length=200)
    # Partitions of each alerts topic when the notifier creates it.
    alerts_topic_partitions: int = Field(3, ge=1, le=1000)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    # How long one webhook delivery may take before it is retried.
    webhook_timeout_seconds: float = Field(5.0, gt=0, le=120)
    webhook_max_attempts: int = Field(
        12,
        ge=1,
        le=1000,
        description="a webhook destination failing this many attempts in a row (5xx, 408, "
        "429, timeout, refused) has spent its retry budget: what waits for it is "
        "dead-lettered, and after each later failed attempt what was queued since; backoff "
        "0.5 s doubling to 60 s per URL: 12 is about 5 min of failing",
    )
    webhook_max_age_seconds: float = Field(
        3600.0,
        gt=0,
        le=7 * 86400,
        description="a failed attempt to a webhook destination also dead-letters its items "
        "waiting longer than this (a destination failing often, but not "
        "webhook_max_attempts times in a row)",
    )
    webhook_max_pending: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="pending webhook items per destination (URL); past it a new item for "
        "that URL is dead-lettered at once (outbox full for this destination)",
    )
    report_limits: ReportLimits = Field(default_factory=ReportLimits)
    dead_letters_max: int = Field(
        10_000, ge=1, le=1_000_000, description="dead letters kept in the outbox's table"
    )
    lag: LagSettings = Field(default_factory=LagSettings)
    probe: ProbeSettings = Field(default_factory=ProbeSettings)

    def resolved_outbox_path(self) -> Path:
        if self.outbox_path is not None:
            return self.outbox_path
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        name = f"{self.grpc_port}" if self.grpc_port else f"pid{os.getpid()}"
        return Path(state) / "dataservice" / f"notifier-outbox-{name}.sqlite"

    @field_validator("suppression_window_seconds")
    @classmethod
    def _known_types(cls, value: dict[str, float]) -> dict[str, float]:
        for name, seconds in value.items():
            if name != "*":
                parse_type(name)
            if seconds < 0:
                raise ValueError(f"window of {name} must not be negative")
        return value
