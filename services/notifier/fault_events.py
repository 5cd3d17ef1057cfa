"""The notifier's own fault events (the catalogue is ``services/runtime/faults.py``):
TEMPLATE_FAILED when it disables an alert template, DEAD_LETTER when an outbox item goes
to the dead-letter table. Pure builders; the pipeline reports them like any other fault
(the lag evaluator's and the probe's are built in their modules)."""

from __future__ import annotations

from collections.abc import Sequence

from dataservice.common.v1 import common_pb2
from services.notifier.egress import redact
from services.notifier.outbox import WEBHOOK_LANE, OutboxItem
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


def dead_letter(
    items: Sequence[OutboxItem], why: str, instance: str
) -> list[common_pb2.FaultEvent]:
    """DEAD_LETTER for items moved to the dead-letter table together (one, or a webhook
    destination's waiting items in bulk, all to one destination), OPEN and at once RESOLVED
    (the relay went on). A webhook's URL is named redacted; a bulk move says how many
    (attribute ``count``) and the first and last ids."""
    spec = faults.CATALOGUE[common_pb2.FAULT_TYPE_DEAD_LETTER]
    first = items[0]
    destination = redact(first.destination) if first.lane == WEBHOOK_LANE else first.destination
    attributes = {
        "kind": first.kind,
        "id": first.id,
        "destination": destination[:_MAX_ATTRIBUTE],
        "error": why[:_MAX_ATTRIBUTE],
        "bytes": str(sum(len(item.value) for item in items)),
    }
    what = f"{first.kind} {first.id}"
    if len(items) > 1:
        attributes.update({"count": str(len(items)), "last_id": items[-1].id})
        what = f"{len(items)} {first.kind}s ({first.id} .. {items[-1].id})"
    key = faults.dedupe_key(spec.type, first.id)
    return [
        common_pb2.FaultEvent(
            type=spec.type,
            state=state,
            severity=spec.severity,
            source_service="notifier",
            source_instance=instance,
            message=f"{what} to {destination} dead-lettered: {why}"[:4096],
            attributes=attributes,
            dedupe_key=key,
        )
        for state in (OPEN, RESOLVED)
    ]
