"""A ``ResetOffsetsRequest`` checked against its group: which partitions, with which value
(pure).

Each check raises ``DsError(INVALID_FIELD)`` naming the field (AIP-193). What a valid
request becomes is a :class:`ResetSpec`: the strategy and, per affected partition, the value
it applies (the request's, or the target's own). The clock is a parameter: a timestamp in
the future is refused against the assigner's wall clock, with a little tolerance for the
caller's clock running ahead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dataservice.assigner.v1 import admin_pb2
from dsclient.reasons import invalid
from services.assigner.reset_targets import Strategy
from services.runtime.topic_partition import TopicPartition

# A caller whose clock runs ahead of the assigner's by up to this much can still reset to
# "now"; a timestamp further ahead is refused (it would mean "the end" in every partition,
# which --to-latest says plainly).
FUTURE_TOLERANCE_MS = 5_000
MAX_TARGETS = 10_000

STRATEGIES = {
    admin_pb2.RESET_STRATEGY_EARLIEST: Strategy.EARLIEST,
    admin_pb2.RESET_STRATEGY_LATEST: Strategy.LATEST,
    admin_pb2.RESET_STRATEGY_TIMESTAMP: Strategy.TIMESTAMP,
    admin_pb2.RESET_STRATEGY_ABSOLUTE: Strategy.ABSOLUTE,
    admin_pb2.RESET_STRATEGY_SHIFT_BY: Strategy.SHIFT_BY,
}


@dataclass(frozen=True)
class ResetSpec:
    strategy: Strategy
    values: dict[TopicPartition, int]  # the affected partitions, each with its value


def reset_spec(
    request: admin_pb2.ResetOffsetsRequest,
    group_topics: Sequence[str],
    partitions: Sequence[TopicPartition],
    now_ms: int,
) -> ResetSpec:
    """The partitions ``request`` resets, each with its value; INVALID_FIELD otherwise.
    ``partitions`` are the group's (every partition of its topics)."""
    strategy = STRATEGIES.get(request.strategy)
    if strategy is None:
        raise invalid("strategy", "must be one of EARLIEST, LATEST, TIMESTAMP, ABSOLUTE, SHIFT_BY")
    if len(request.targets) > MAX_TARGETS:
        raise invalid("targets", f"at most {MAX_TARGETS} partitions per request")
    known = set(partitions)
    values: dict[TopicPartition, int] = {}
    if request.targets:
        for i, target in enumerate(request.targets):
            tp = TopicPartition(target.topic, target.partition)
            _check_topic(f"targets[{i}].topic", target.topic, group_topics)
            if tp not in known:
                count = sum(1 for p in partitions if p.topic == target.topic)
                raise invalid(
                    f"targets[{i}].partition",
                    f"{target.topic} has partitions 0..{count - 1}, not {target.partition}",
                )
            if tp in values:
                raise invalid(f"targets[{i}]", f"{target.topic}/{target.partition} is named twice")
            value = target.value if target.HasField("value") else request.value
            values[tp] = _checked_value(
                f"targets[{i}].value" if target.HasField("value") else "value",
                strategy,
                value,
                now_ms,
            )
        return ResetSpec(strategy, values)
    for i, topic in enumerate(request.topics):
        _check_topic(f"topics[{i}]", topic, group_topics)
    topics = set(request.topics) or set(group_topics)
    value = _checked_value("value", strategy, request.value, now_ms)
    return ResetSpec(strategy, {tp: value for tp in sorted(partitions) if tp.topic in topics})


def _check_topic(field: str, topic: str, group_topics: Sequence[str]) -> None:
    if not topic:
        raise invalid(field, "must not be empty")
    if topic not in group_topics:
        raise invalid(field, f"{topic!r} is not a topic of the group ({', '.join(group_topics)})")


def _checked_value(field: str, strategy: Strategy, value: int, now_ms: int) -> int:
    if strategy is Strategy.ABSOLUTE and value < 0:
        raise invalid(field, f"an offset must be >= 0, not {value}")
    if strategy is Strategy.TIMESTAMP:
        if value < 0:
            raise invalid(field, f"a timestamp (ms since the Unix epoch) must be >= 0, not {value}")
        if value > now_ms + FUTURE_TOLERANCE_MS:
            raise invalid(
                field,
                f"timestamp {value} is in the future (the assigner's clock reads {now_ms}); "
                "to skip to the end use LATEST",
            )
    return value if strategy.takes_value else 0
