"""A group's settings that are proto enums, and the names the mesh spells them with: the
admin API's records and validation, dsctl's views and DsGroup manifests, the assigner's
group state and the sidecar's session all read these two directions from here.

Proto value → name: an unspecified value is named as the default it stands for. Name →
proto value: only the values one may choose (no unspecified)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from dataservice.assigner.v1 import types_pb2
from dataservice.common.v1 import common_pb2

MODES: Mapping[common_pb2.GroupMode.ValueType, str] = {
    common_pb2.GROUP_MODE_LEASED: "leased",
    common_pb2.GROUP_MODE_KAFKA_GROUP: "kafka_group",
}
BALANCE_STRATEGIES: Mapping[types_pb2.BalanceStrategy.ValueType, str] = {
    types_pb2.BALANCE_STRATEGY_UNSPECIFIED: "count",
    types_pb2.BALANCE_STRATEGY_COUNT: "count",
    types_pb2.BALANCE_STRATEGY_LOAD: "load",
}
EXTERNAL_OFFSET_CHANGES: Mapping[types_pb2.ExternalOffsetChanges.ValueType, str] = {
    types_pb2.EXTERNAL_OFFSET_CHANGES_UNSPECIFIED: "follow",
    types_pb2.EXTERNAL_OFFSET_CHANGES_FOLLOW: "follow",
    types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT: "revert",
    types_pb2.EXTERNAL_OFFSET_CHANGES_IGNORE: "ignore",
}
# "" = unspecified: each sidecar's commit_fencing setting.
COMMIT_FENCINGS: Mapping[types_pb2.CommitFencing.ValueType, str] = {
    types_pb2.COMMIT_FENCING_UNSPECIFIED: "",
    types_pb2.COMMIT_FENCING_LEASE: "lease",
    types_pb2.COMMIT_FENCING_KAFKA: "kafka",
}
ORDERINGS: Mapping[types_pb2.Ordering.ValueType, str] = {
    types_pb2.ORDERING_UNSPECIFIED: "unordered",
    types_pb2.ORDERING_UNORDERED: "unordered",
    types_pb2.ORDERING_KEY: "key",
    types_pb2.ORDERING_PARTITION: "partition",
}


V = TypeVar("V", bound=int)


def _by_name(names: Mapping[V, str]) -> Mapping[str, V]:
    # Unspecified is 0 in every proto3 enum.
    return {name: value for value, name in names.items() if value != 0}


MODE_BY_NAME = _by_name(MODES)
BALANCE_STRATEGY_BY_NAME = _by_name(BALANCE_STRATEGIES)
EXTERNAL_CHANGE_BY_NAME = _by_name(EXTERNAL_OFFSET_CHANGES)
COMMIT_FENCING_BY_NAME = _by_name(COMMIT_FENCINGS)
ORDERING_BY_NAME = _by_name(ORDERINGS)
