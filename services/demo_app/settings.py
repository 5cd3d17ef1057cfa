"""Demo application settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

import socket

from pydantic import Field, field_validator

from services.runtime.addresses import parse_host_port
from services.runtime.settings import ServiceSettings


class DemoAppSettings(ServiceSettings):
    http_port: int = Field(7082, ge=0, le=65535, description="/healthz, /metrics, /received")
    group: str = Field(min_length=1, max_length=249, description="the group to read")
    assigner: str = Field("127.0.0.1:7070", description="assigner HOST:PORT to bind through")
    # The client id the demo application binds with (default: the host name).
    client_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=255)
    max_records: int = Field(500, ge=1, le=100_000, description="records per fetch")
    fetch_wait_seconds: float = Field(1.0, gt=0, le=60, description="long-poll of a fetch")
    max_log_records: int = Field(
        1_000_000, ge=1, description="acked records kept for /received (older ones dropped)"
    )

    @field_validator("assigner")
    @classmethod
    def _valid_assigner(cls, value: str) -> str:
        parse_host_port(value, what="assigner address")
        return value
