"""Notifier settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

from pydantic import Field

from services.runtime.settings import ServiceSettings


class NotifierSettings(ServiceSettings):
    grpc_port: int = Field(7090, ge=0, le=65535)
    http_port: int = Field(7091, ge=0, le=65535)
    faults_topic: str = Field("ds.faults", min_length=1, max_length=249)
    faults_topic_partitions: int = Field(6, ge=1, le=1000)
    faults_topic_replication: int = Field(1, ge=1, le=7)
    recent_faults: int = Field(10_000, ge=100, le=1_000_000, description="kept for ListFaults")
