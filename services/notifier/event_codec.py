"""How a fault event is written to ``ds.faults``: protobuf (the default) or the protobuf JSON
mapping (setting ``fault_encoding``), named by the record's ``content-type`` header so a
reader never has to guess."""

from __future__ import annotations

from google.protobuf import json_format

from dataservice.common.v1 import common_pb2

PROTOBUF_CONTENT_TYPE = "application/x-protobuf; type=dataservice.common.v1.FaultEvent"
JSON_CONTENT_TYPE = "application/json; type=dataservice.common.v1.FaultEvent"


def encode_event(event: common_pb2.FaultEvent, encoding: str) -> tuple[bytes, str]:
    """The record value of ``event`` and its content type."""
    if encoding == "json":
        text = json_format.MessageToJson(event, preserving_proto_field_name=True, indent=None)
        return text.encode(), JSON_CONTENT_TYPE
    return event.SerializeToString(), PROTOBUF_CONTENT_TYPE


def decode_event(value: bytes, content_type: str) -> common_pb2.FaultEvent:
    """The event of a record written by :func:`encode_event`."""
    event = common_pb2.FaultEvent()
    if content_type.startswith("application/json"):
        json_format.Parse(value, event)
    else:
        event.ParseFromString(value)
    return event
