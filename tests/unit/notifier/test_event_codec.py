"""The notifier writes fault events as protobuf by default and as JSON on request."""

from __future__ import annotations

from dataservice.common.v1 import common_pb2


def test_events_encode_as_protobuf_by_default_and_json_on_request() -> None:
    from services.notifier.event_codec import decode_event, encode_event

    event = common_pb2.FaultEvent(
        id="00000000-0000-4000-8000-000000000001",
        type=common_pb2.FAULT_TYPE_LAG_ERROR,
        state=common_pb2.FAULT_STATE_OPEN,
        severity=common_pb2.SEVERITY_ERROR,
        group="g",
        partitions=[1, 2],
        suppressed_count=3,
    )
    event.attributes["lag"] = "12"
    raw, content_type = encode_event(event, "protobuf")
    assert content_type.startswith("application/x-protobuf")
    assert decode_event(raw, content_type) == event
    text, json_type = encode_event(event, "json")
    assert json_type.startswith("application/json")
    assert b'"type": "FAULT_TYPE_LAG_ERROR"' in text and b'"suppressed_count": "3"' in text
    assert decode_event(text, json_type) == event
