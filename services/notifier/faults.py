"""The notifier's own fault events (the catalogue is ``services/runtime/faults.py``):
TEMPLATE_FAILED when it disables an alert template. Pure builders; the pipeline reports
them like any other fault (the lag evaluator's and the probe's are built in their
modules)."""

from __future__ import annotations

from dataservice.common.v1 import common_pb2
from services.runtime import faults

OPEN = common_pb2.FAULT_STATE_OPEN
RESOLVED = common_pb2.FAULT_STATE_RESOLVED
# Attribute values are cut to this (an error text can be long).
_MAX_ATTRIBUTE = 1024


def template_failed(
    caller: str, name: str, why: str, instance: str, *, resolved: bool = False
) -> common_pb2.FaultEvent:
    """TEMPLATE_FAILED for template (caller, name): OPEN when it is disabled, RESOLVED
    when it is put again."""
    spec = faults.CATALOGUE[common_pb2.FAULT_TYPE_TEMPLATE_FAILED]
    message = (
        f"alert template {caller}/{name} was put again and is enabled"
        if resolved
        else f"alert template {caller}/{name} disabled: {why}"
    )
    event = common_pb2.FaultEvent(
        type=spec.type,
        state=RESOLVED if resolved else OPEN,
        severity=spec.severity,
        source_service="notifier",
        source_instance=instance,
        message=message[:4096],
        dedupe_key=faults.dedupe_key(spec.type, caller, name),
    )
    event.attributes.update({"caller": caller, "template": name, "why": why[:_MAX_ATTRIBUTE]})
    return event
