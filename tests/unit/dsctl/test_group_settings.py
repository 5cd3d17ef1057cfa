"""The group settings ``dsctl config set`` takes beside librdkafka properties (pure):
``ordering`` and ``commit_fencing`` parsed, checked, and written as one UpdateGroup."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.dsctl import config_view, group_settings
from services.dsctl.app import app
from services.dsctl.config import update_request
from services.runtime.consumer_config import plan


def group(**fields: object) -> types_pb2.GroupConfig:
    return types_pb2.GroupConfig(name="g", config_version=7, **fields)  # type: ignore[arg-type]


def test_settings_are_told_apart_from_consumer_properties() -> None:
    sets = config_view.parse_assignments(
        ["ordering=key", "fetch.max.bytes=1048576", "commit_fencing=kafka"]
    )
    consumer, consumer_unsets, settings, setting_unsets = group_settings.split(
        sets, ["client.rack", "commit_fencing"]
    )
    assert consumer == {"fetch.max.bytes": "1048576"}
    assert consumer_unsets == ["client.rack"]
    assert settings == {"ordering": "key", "commit_fencing": "kafka"}
    assert setting_unsets == ["commit_fencing"]


def test_a_change_names_each_setting_before_and_after_and_leaves_out_the_same_value() -> None:
    cfg = group(ordering=types_pb2.ORDERING_KEY)
    assert group_settings.changes(
        cfg, {"ordering": "partition", "commit_fencing": "kafka"}, []
    ) == {
        "commit_fencing": (None, "kafka"),
        "ordering": ("key", "partition"),
    }
    assert group_settings.changes(cfg, {"ordering": "key"}, []) == {}
    fenced = group(commit_fencing=types_pb2.COMMIT_FENCING_LEASE)
    assert group_settings.changes(fenced, {}, ["commit_fencing"]) == {
        "commit_fencing": ("lease", None)
    }
    # An unspecified ordering is unordered (as the assigner stores and shows it).
    assert group_settings.value_of(group(), "ordering") == "unordered"
    assert group_settings.changes(group(), {"ordering": "unordered"}, []) == {}


@pytest.mark.parametrize(
    ("sets", "unsets", "message"),
    [
        ({"ordering": "sideways"}, [], "ordering: unknown value 'sideways': expected unordered, "
         "key or partition"),
        ({"ordering": "Key"}, [], "ordering: unknown value 'Key'"),
        ({"commit_fencing": "zookeeper"}, [], "commit_fencing: unknown value 'zookeeper': "
         "expected lease or kafka"),
        ({"commit_fencing": ""}, [], "commit_fencing: unknown value ''"),
        ({}, ["commit_fencing"], "--unset commit_fencing: the group does not set it"),
        ({}, ["ordering"], "--unset ordering: ordering is always set; set ordering=unordered"),
        ({"commit_fencing": "kafka"}, ["commit_fencing"], "commit_fencing: both set and unset"),
    ],
)  # fmt: skip
def test_a_bad_value_or_unset_is_refused_naming_the_key(
    sets: dict[str, str], unsets: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        group_settings.changes(group(), sets, unsets)


def test_the_update_masks_only_what_changes() -> None:
    before = group(consumer_config={"fetch.max.bytes": "1"})
    only = update_request(before, None, {"ordering": (None, "key")})
    assert list(only.update_mask.paths) == ["ordering"]
    assert only.group.ordering == types_pb2.ORDERING_KEY and not only.group.consumer_config
    assert only.expected_config_version == 7 and only.request_id

    both = update_request(
        before,
        {"fetch.max.bytes": "2"},
        {"commit_fencing": ("lease", None), "ordering": ("key", "partition")},
    )
    assert list(both.update_mask.paths) == ["consumer_config", "commit_fencing", "ordering"]
    assert both.group.commit_fencing == types_pb2.COMMIT_FENCING_UNSPECIFIED  # unset
    assert both.group.ordering == types_pb2.ORDERING_PARTITION
    assert dict(both.group.consumer_config) == {"fetch.max.bytes": "2"}


def test_the_documents_show_the_settings_and_their_change() -> None:
    before = group(ordering=types_pb2.ORDERING_UNORDERED)
    after = group(ordering=types_pb2.ORDERING_KEY, commit_fencing=types_pb2.COMMIT_FENCING_KAFKA)
    after.config_version = 8
    settings: group_settings.SettingsChange = {
        "commit_fencing": (None, "kafka"),
        "ordering": ("unordered", "key"),
    }
    change = plan(before.consumer_config, after.consumer_config, kafka_group=False)
    doc = config_view.set_doc(before, after, change, [], settings)
    assert doc["settings"] == {"ordering": "key", "commit_fencing": "kafka"}
    assert doc["changes"]["settings"] == {
        "commit_fencing": {"from": None, "to": "kafka"},
        "ordering": {"from": "unordered", "to": "key"},
    }
    lines = [line.plain for line in config_view.diff_lines(doc["changes"])]
    assert lines == [
        "  ~ commit_fencing: (unset: each sidecar's commit_fencing setting) → kafka",
        "  ~ ordering: unordered → key",
    ]
    # a settings-only change says nothing about consumers, one line per setting
    effects = config_view.effects("leased", change, settings)
    assert [e.split(":")[0] for e in effects] == ["commit_fencing", "ordering"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ordering=sideways"], "ordering: unknown value 'sideways': expected unordered, key or "
         "partition"),
        (["fetch.max.bytes=1048576", "commit_fencing=zookeeper"], "commit_fencing: unknown value "
         "'zookeeper': expected lease or kafka"),
        (["--unset", "ordering"], "--unset ordering: ordering is always set; set "
         "ordering=unordered"),
    ],
)  # fmt: skip
def test_the_cli_refuses_a_bad_value_with_exit_1_before_asking_the_assigner(
    args: list[str], message: str
) -> None:
    # Nothing listens at port 1: the refusal comes before any call.
    result = CliRunner().invoke(
        app, ["config", "set", "g", *args, "--yes", "--assigner", "127.0.0.1:1"]
    )
    assert result.exit_code == 1
    assert " ".join(result.stderr.split()) == f"error: {message}"


def test_config_get_shows_the_settings_beside_the_consumer_config() -> None:
    described = admin_pb2.DescribeGroupResponse(
        config=group(
            mode=common_pb2.GROUP_MODE_LEASED,
            consumer_config={"fetch.max.bytes": "4194304"},
            ordering=types_pb2.ORDERING_KEY,
        )
    )
    doc = config_view.get_doc(described)
    assert doc["settings"] == {"ordering": "key", "commit_fencing": None}
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(config_view.get_view(doc))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[:6] == [
        "g (leased): config v7",
        "consumer config",
        "  fetch.max.bytes  4194304",
        "group settings",
        "  ordering        key",
        "  commit_fencing  (unset: each sidecar's commit_fencing setting)",
    ]
