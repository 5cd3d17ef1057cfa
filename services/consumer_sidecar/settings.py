"""Sidecar settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dsclient import local_socket
from dsclient.addresses import parse_host_port
from services.runtime.settings import ServiceSettings, is_loopback


class SidecarSettings(ServiceSettings):
    grpc_port: int = Field(7080, ge=0, le=65535)
    http_port: int = Field(7081, ge=0, le=65535)
    # This sidecar's stable identity (the pod name): a restart with the same id within the hold
    # window gets its partitions back.
    id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=255)
    group: str = Field(min_length=1, max_length=249, description="the group this sidecar serves")
    assigner: str = Field("127.0.0.1:7070", description="assigner HOST:PORT (static discovery)")
    # The zone (failure domain) the balancer may use to keep partitions in-zone; empty = none.
    zone: str = ""
    capacity: int = Field(0, ge=0, description="max partitions (0 = unlimited)")
    # The cap on records buffered over all partitions (and ReadRange's reservations); fetching holds
    # back and pauses partitions at it.
    buffer_max_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024, le=8 * 1024**3)
    read_range_max_streams: int = Field(
        4,
        ge=1,
        le=256,
        description="ReadRange streams open at once; another is RESOURCE_EXHAUSTED "
        "(TOO_MANY_RANGE_READS)",
    )
    read_range_prefetch_bytes: int = Field(
        4 * 1024 * 1024,
        ge=2 * 1024 * 1024,
        le=1024**3,
        description="what each ReadRange consumer may prefetch (half its "
        "queued.max.messages.kbytes, half fetch.max.bytes); reserved from buffer_max_bytes "
        "with the stream's chunk while the stream is open",
    )
    read_range_buffer_share: float = Field(
        0.5,
        gt=0,
        le=0.9,
        description="the part of buffer_max_bytes open ReadRange streams may reserve "
        "together; the leased buffer keeps the rest",
    )
    # How often acked offsets are committed at most; an ack can commit sooner (commit_max_acks, acks
    # that wait for their commit).
    commit_interval_seconds: float = Field(1.0, gt=0, le=60)
    commit_max_acks: int = Field(1000, ge=1, description="commit early after this many acks")
    external_check_interval_seconds: float = Field(
        0.5,
        gt=0,
        le=60,
        description="right before a commit, a partition's committed offset is read back if it "
        "was not within this long, to notice a commit this sidecar did not make "
        "(kafka-consumer-groups --reset-offsets); all held partitions are read back every "
        "max(this, 1 s)",
    )
    commit_fencing: Literal["lease", "kafka"] = Field(
        "lease",
        description="what keeps a sidecar that outlived its lease from committing behind "
        "the next holder. lease: the local lease deadline (it stops delivering and committing "
        "a TTL after the assigner last renewed it, so it also stops when no assigner is "
        "reachable). kafka: a transactional producer per held lease, fenced at the broker by "
        "the next holder (issue 36); leases then outlive the assigner's absence. The "
        "default for groups whose config does not set commit_fencing (the group's value "
        "wins); every sidecar of such a group must use the same value "
        "(docs/operate/failure-model.md)",
    )
    # What the local lease deadline keeps before TTL: the sidecar stops a partition at heartbeat
    # send time + TTL - margin.
    lease_safety_margin_seconds: float = Field(0.5, ge=0.05, le=30)
    delivery_margin_seconds: float = Field(
        0.5,
        ge=0,
        le=30,
        description="no record is handed out when less than this is left of a partition's "
        "local lease, so what was delivered can be acked and committed under the lease "
        "(0 = deliver until the deadline)",
    )
    # Records per consume(): each batch costs a fixed overhead (per-partition column
    # chunks, a wakeup of the delivery side); 5000 cut the sidecar's CPU per record by a
    # third in tests/bench/bench_sidecar.py's Stream runs compared with 1000.
    consume_batch: int = Field(5000, ge=1, le=100_000)
    visibility_timeout_seconds: float = Field(
        30.0,
        ge=1,
        le=43_200,
        description="how long a delivered record may stay un-acked before it is delivered "
        "again, for groups whose config sets no visibility_timeout",
    )
    max_deliveries: int = Field(
        10,
        ge=0,
        description="deliveries without an ack after which a record that comes due again is "
        "given up (POISON_RECORD), for groups whose config sets none; 0 = never",
    )
    # Issue 39: records given up past max_deliveries go to this topic (created at start
    # unless it exists) before the commit point passes them; "" = none (POISON_RECORD
    # only, the records are committed past).
    dead_letter_topic: str = Field(
        "",
        description="the group's dead-letter topic ({group} = the group's name): a record "
        "given up past max_deliveries is produced there, with headers naming its origin, "
        "before its offset is committed past; empty = no dead-letter topic",
    )
    dead_letter_partitions: int = Field(
        1, ge=1, le=1000, description="partitions of the dead-letter topic when created"
    )
    dead_letter_check_interval_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="how often the dead-letter topic's depth and oldest record are read "
        "for the metrics",
    )
    drain_timeout_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="kafka_group mode: how long a revoked partition waits for in-flight "
        "acks before committing (leased mode uses the assigner's drain timeout)",
    )
    statistics_interval_ms: int = Field(
        5000, ge=0, le=600_000, description="librdkafka statistics period (0 = off)"
    )
    metrics_enabled: bool = Field(
        True,
        description="count consumption, commits, leases, polls and client access (off: "
        "only the scrape-time views of the partition table and statistics remain)",
    )
    metrics_max_client_ids: int = Field(
        100, ge=1, le=10_000, description="client_id label values tracked before 'other'"
    )
    metrics_client_idle_seconds: float = Field(
        600.0, ge=0, description="idle time after which a client_id gives its label up"
    )
    uds_dir: Path | None = Field(
        None,
        description="also serve the StreamService on a Unix domain socket in this directory "
        "(a volume shared with the application's container), file sidecar-ID.d/sidecar-ID.sock "
        "(a directory only the sidecar writes, mode 0750); "
        "unset = TCP only",
    )
    shm_segment_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        le=1024 * 1024 * 1024,
        description="with uds_dir: the shared-memory segment of each Stream that asks for "
        "DELIVERY_FORMAT_ARROW_SHM, a file of this size beside the socket (a memory emptyDir: "
        "count it in the volume's sizeLimit); 0 = that format is refused",
    )

    @property
    def local_socket_path(self) -> Path | None:
        """The socket file for the application in the pod; None: TCP only. Its name
        carries the sidecar id, so a client never reaches another pod's sidecar through a
        same-named path. It lives in the sidecar's own directory of ``uds_dir`` (mode 0750,
        ``sidecar-ID.d``), with the shared-memory segments: the volume may be writable by
        every user (an emptyDir is), that directory by the sidecar only, so the client can
        check who put the socket there (issue 37, findings 1 and 12)."""
        if self.uds_dir is None:
            return None
        directory = self.uds_dir / local_socket.sidecar_directory_name(self.id)
        return directory / local_socket.sidecar_file_name(self.id)

    def tokens_only_on_socket(self) -> bool:
        """Auth without TLS is sound for a sidecar serving its pod's socket (``uds_dir``) whose
        TCP listener is on loopback: callers are authenticated on the socket only (a file in a
        directory only the sidecar writes, in a volume only the pod mounts; the bytes stay in
        the kernel), and its plaintext TCP port, which nothing outside the pod reaches,
        refuses every call but health checks (docs/operate/threat-model.md)."""
        return self.uds_dir is not None and is_loopback(self.host)

    @model_validator(mode="after")
    def _id_names_a_file(self) -> SidecarSettings:
        if self.uds_dir is not None and ("/" in self.id or "\x00" in self.id):
            raise ValueError("with uds_dir, id must not contain '/' or NUL (it names the socket)")
        return self

    @field_validator("assigner")
    @classmethod
    def _valid_assigner(cls, value: str) -> str:
        parse_host_port(value, what="assigner address")
        return value
