"""Operator settings (flags > DS_* env > YAML file > defaults)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from services.runtime.settings import DsSettings, OneLineArgumentParser


class OperatorSettings(DsSettings):
    assigner: str = Field(
        "127.0.0.1:7070", description="the assigner's gRPC host:port (any replica: followed)"
    )
    namespace: str = Field(
        "", description="the namespace whose DsGroups are reconciled (empty = every namespace)"
    )
    kubeconfig: Path | None = Field(
        None, description="kubeconfig file; unset = the pod's service account (in cluster)"
    )
    lease_name: str = Field("ds-operator", description="the coordination.k8s.io Lease's name")
    lease_namespace: str = Field("dataservice", description="the Lease's namespace")
    lease_duration_seconds: float = Field(
        15.0, gt=0, description="how long a leader's Lease holds without renewal"
    )
    identity: str = Field(
        default_factory=socket.gethostname,
        description="this replica's name in the Lease (default: the host name, the pod's)",
    )
    interval_seconds: float = Field(
        2.0, gt=0, description="seconds between two passes over the DsGroups (level-triggered)"
    )
    alive_file: Path | None = Field(
        None,
        description="touched after every round (the Lease step and, leading, the pass): "
        "the liveness probe checks its age",
    )
    # json (one object a line, for log collectors) or console (for people).
    log_format: Literal["json", "console"] = "json"
    # The lowest level logged.
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @model_validator(mode="after")
    def _renewal_fits(self) -> OperatorSettings:
        if self.interval_seconds >= self.lease_duration_seconds:
            raise ValueError("interval_seconds must be below lease_duration_seconds")
        return self


def parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(
        prog="ds-operator",
        description="Reconciles DsGroup resources through the assigner's admin API.",
    )
    p.add_argument("--assigner", help="assigner host:port (DS_ASSIGNER)")
    p.add_argument("--namespace", help="namespace to reconcile, empty = all (DS_NAMESPACE)")
    p.add_argument("--kubeconfig", help="kubeconfig file; unset = in cluster (DS_KUBECONFIG)")
    p.add_argument("--lease-name", dest="lease_name", help="(DS_LEASE_NAME)")
    p.add_argument("--lease-namespace", dest="lease_namespace", help="(DS_LEASE_NAMESPACE)")
    p.add_argument(
        "--lease-duration", dest="lease_duration_seconds", help="(DS_LEASE_DURATION_SECONDS)"
    )
    p.add_argument("--identity", help="name in the Lease (DS_IDENTITY)")
    p.add_argument("--interval", dest="interval_seconds", help="(DS_INTERVAL_SECONDS)")
    p.add_argument("--alive-file", dest="alive_file", help="(DS_ALIVE_FILE)")
    p.add_argument("--log-format", dest="log_format", help="json | console (DS_LOG_FORMAT)")
    p.add_argument("--log-level", dest="log_level", help="(DS_LOG_LEVEL)")
    p.add_argument("--config", help="YAML settings file (DS_CONFIG)")
    return p
