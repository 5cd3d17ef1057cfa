"""A fault reporter that is never started, and what it would have sent: the unit tests of
the reporter and of each service's fault emitters read its buffer."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from dataservice.common.v1 import common_pb2
from services.runtime.reporter import FaultReporter, ReporterConfig

T = common_pb2


def reporter(capacity: int = 100) -> FaultReporter:
    # Never started: report() only stamps and buffers.
    return FaultReporter(
        ReporterConfig("assigner", "node-1", notifier="127.0.0.1:1", capacity=capacity),
        CollectorRegistry(),
    )


def kinds(r: FaultReporter) -> list[tuple[str, str]]:
    return [
        (T.FaultType.Name(e.type).removeprefix("FAULT_TYPE_"), T.FaultState.Name(e.state)[12:])
        for e in r.buffered()
    ]
