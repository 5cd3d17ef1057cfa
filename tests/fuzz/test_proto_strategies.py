"""The descriptor-driven strategy builder of ``tests.support.proto_strategies`` (no
services needed): every RPC's request message gets a strategy whose messages serialize
and parse back unchanged, and a field type without a strategy is an error, not a gap."""

from __future__ import annotations

import math

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.proto_strategies import UnsupportedField, message_strategy, methods

RPCS = methods()


def test_every_service_of_the_mesh_is_enumerated() -> None:
    services = {m.containing_service.full_name for m in RPCS}
    assert services == {
        "dataservice.assigner.v1.AdminService",
        "dataservice.assigner.v1.AssignerService",
        "dataservice.assigner.v1.BindingService",
        "dataservice.notifier.v1.NotifierService",
        "dataservice.sidecar.v1.StreamService",
    }


def _has_nan(value: object) -> bool:
    """Whether a NaN sits anywhere in ``value`` (a message, a repeated field or map, a
    scalar)."""
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, Message):
        return any(_has_nan(v) for _, v in value.ListFields())
    if isinstance(value, (str, bytes)):
        return False
    if hasattr(value, "values") and callable(value.values):
        return any(_has_nan(v) for v in value.values())
    if hasattr(value, "__iter__"):
        return any(_has_nan(v) for v in value)  # type: ignore[attr-defined]
    return False


@pytest.mark.parametrize("method", RPCS, ids=lambda m: m.full_name)
def test_request_strategy_round_trips(method: object) -> None:
    cls = message_factory.GetMessageClass(method.input_type)  # type: ignore[attr-defined]

    @settings(max_examples=25, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(message_strategy(method.input_type))  # type: ignore[attr-defined]
    def check(message: Message) -> None:
        assert isinstance(message, cls)
        wire = message.SerializeToString()
        again = cls.FromString(wire)
        # NaN != NaN; maps serialize in no fixed order: compare sizes then.
        assert len(again.SerializeToString()) == len(wire)
        if not _has_nan(message):
            assert again == message

    check()


def test_overrides_replace_a_field_by_full_name() -> None:
    rpc = next(m for m in RPCS if m.full_name.endswith("BindingService.Bind"))
    strategy = message_strategy(
        rpc.input_type, {"dataservice.assigner.v1.BindRequest.group": st.just("only-this")}
    )

    @settings(max_examples=30, database=None, deadline=None)
    @given(strategy)
    def check(message: Message) -> None:
        assert message.group in ("", "only-this")  # type: ignore[attr-defined]

    check()


def test_a_field_type_without_strategy_is_an_error() -> None:
    pool = descriptor_pool.DescriptorPool()
    file = descriptor_pb2.FileDescriptorProto(
        name="legacy.proto", package="legacy", syntax="proto2"
    )
    group_type = file.message_type.add(name="Item")
    group_type.field.add(name="x", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                         label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    outer = file.message_type.add(name="Outer")
    outer.field.add(name="item", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_GROUP,
                    type_name=".legacy.Item",
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)  # fmt: skip
    pool.Add(file)
    with pytest.raises(UnsupportedField, match=r"legacy\.Outer\.item"):
        message_strategy(pool.FindMessageTypeByName("legacy.Outer"))
