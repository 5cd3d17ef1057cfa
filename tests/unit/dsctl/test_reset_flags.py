"""dsctl offsets reset's flags → ResetOffsetsRequest (pure)."""

from __future__ import annotations

import datetime

import pytest

from dataservice.assigner.v1 import admin_pb2
from services.dsctl.admin_client import CliError, ExitCode
from services.dsctl.reset_flags import ResetFlags, parse_datetime, parse_topic, reset_request


def test_one_strategy_with_its_value() -> None:
    request = reset_request("g", ResetFlags(shift_by=-100), dry_run=True, request_id="r")
    assert (request.strategy, request.value, request.dry_run, request.request_id) == (
        admin_pb2.RESET_STRATEGY_SHIFT_BY,
        -100,
        True,
        "r",
    )
    assert list(request.topics) == [] and list(request.targets) == []


@pytest.mark.parametrize(
    "flags",
    [ResetFlags(), ResetFlags(to_earliest=True, to_latest=True), ResetFlags(to_latest=True,
                                                                            to_offset=3)],
)  # fmt: skip
def test_exactly_one_strategy_is_required(flags: ResetFlags) -> None:
    with pytest.raises(CliError, match="exactly one") as caught:
        reset_request("g", flags, dry_run=True)
    assert caught.value.exit_code is ExitCode.ERROR


def test_topics_and_partitions_as_kafka_consumer_groups_writes_them() -> None:
    whole = reset_request("g", ResetFlags(to_earliest=True, topics=["a", "b", "a"]), dry_run=True)
    assert list(whole.topics) == ["a", "b"]
    some = reset_request("g", ResetFlags(to_offset=5, topics=["a:2,0", "b:1"]), dry_run=False)
    assert [(t.topic, t.partition) for t in some.targets] == [("a", 0), ("a", 2), ("b", 1)]
    assert all(not t.HasField("value") for t in some.targets)  # the request's value applies
    with pytest.raises(CliError, match="every topic"):
        reset_request("g", ResetFlags(to_offset=5, topics=["a:1", "b"]), dry_run=True)


@pytest.mark.parametrize("text", [":1", "a:x", "a:-1", "a:"])
def test_bad_topic_selections_name_the_flag(text: str) -> None:
    with pytest.raises(CliError, match="--topic"):
        parse_topic(text)


def test_datetimes_are_iso_8601_local_unless_zoned() -> None:
    assert parse_datetime("2026-01-31T12:00:00Z") == 1_769_860_800_000
    assert parse_datetime("2026-01-31T13:00:00.000+01:00") == 1_769_860_800_000
    local = datetime.datetime(2026, 1, 31, 12).astimezone()
    assert parse_datetime("2026-01-31T12:00:00.000") == int(local.timestamp() * 1000)
    with pytest.raises(CliError, match="--to-datetime"):
        parse_datetime("yesterday")
