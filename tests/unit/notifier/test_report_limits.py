"""ReportFault's limits (pure validation) and the outbox's dead-letter table."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError
from services.notifier.outbox import KAFKA_LANE, Outbox, OutboxItem
from services.notifier.rpc import validate_event
from services.notifier.settings import ReportLimits

LIMITS = ReportLimits(
    max_attributes=3,
    max_attribute_key_bytes=8,
    max_attribute_value_bytes=16,
    max_partitions=4,
    max_message_bytes=32,
    max_event_bytes=1024,
)


def event(**fields: object) -> common_pb2.FaultEvent:
    out = common_pb2.FaultEvent(
        type=common_pb2.FAULT_TYPE_COMMIT_FAILED,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_ERROR,
        source_service="sidecar",
        group="g",
    )
    attributes = fields.pop("attributes", {})
    partitions = fields.pop("partitions", [])
    for name, value in fields.items():
        setattr(out, name, value)
    out.attributes.update(attributes)
    out.partitions.extend(partitions)
    return out


def test_an_event_within_every_limit_passes() -> None:
    validate_event(
        event(attributes={"a": "x" * 16, "b": "", "k" * 8: "v"}, partitions=[0, 1, 2, 3]),
        LIMITS,
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"attributes": {"a": "", "b": "", "c": "", "d": ""}}, "event.attributes"),
        ({"attributes": {"k" * 9: "v"}}, "event.attributes[kkkkkkkkk]"),
        ({"attributes": {"blob": "x" * 17}}, "event.attributes[blob]"),
        ({"partitions": [0, 1, 2, 3, 4]}, "event.partitions"),
        ({"message": "m" * 33}, "event.message"),
        ({"dedupe_key": "d" * 1024}, "event"),  # within its own cap, not the event's
    ],
)
def test_each_limit_is_invalid_argument_naming_the_field(
    fields: dict[str, object], field: str
) -> None:
    with pytest.raises(DsError) as caught:
        validate_event(event(**fields), LIMITS)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.metadata["field"] == field


def test_dead_letters_leave_the_outbox_and_keep_only_the_newest(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "outbox.sqlite", dead_letters_max=2)
    box.append([OutboxItem(id=f"i{n}", destination="t", value=b"v", key=None) for n in range(4)])
    for item in box.pending(KAFKA_LANE, 3):
        box.dead_letter(item, f"refused {item.id}")
    assert [i.id for i in box.pending(KAFKA_LANE, 10)] == ["i3"]
    letters = box.dead_letters(10)
    assert [(d.item.id, d.error) for d in letters] == [("i1", "refused i1"), ("i2", "refused i2")]
    box.close()
