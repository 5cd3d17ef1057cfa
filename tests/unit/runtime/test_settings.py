"""Settings: validation with one-line errors, address parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsclient.addresses import parse_host_port
from services.assigner.settings import AssignerSettings
from services.consumer_sidecar.settings import SidecarSettings
from services.runtime.settings import ConfigError, load_settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:9092", ("127.0.0.1", 9092)), ("kafka-0.svc:19092", ("kafka-0.svc", 19092)),
     ("[::1]:7070", ("::1", 7070))],
)  # fmt: skip
def test_parse_host_port(value: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(value) == expected


@pytest.mark.parametrize("value", ["localhost", ":9092", "host:0", "host:65536", "host:port", ""])
def test_parse_host_port_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_host_port(value)


def test_bootstrap_list_is_normalised() -> None:
    settings = load_settings(AssignerSettings, {"bootstrap": " a:1, b:2 ,"}, None)
    assert settings.bootstrap == "a:1,b:2"


def test_errors_are_one_line_and_name_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(SidecarSettings, {"group": "", "grpc_port": "x", "assigner": "nohost"}, None)
    message = str(caught.value)
    assert "\n" not in message
    for field in ("group", "grpc_port", "assigner"):
        assert field in message


def test_heartbeat_must_fit_twice_in_the_ttl() -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval_seconds"):
        load_settings(
            AssignerSettings, {"lease_ttl_seconds": 1, "heartbeat_interval_seconds": 0.8}, None
        )


def test_groups_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "a.yaml"
    config.write_text("groups:\n  - name: demo\n    topics: [ds.demo]\n")
    settings = load_settings(AssignerSettings, {}, config)
    assert [(g.name, g.topics, g.mode) for g in settings.groups] == [
        ("demo", ["ds.demo"], "leased")
    ]


def test_hold_mode_is_handoff_by_default_and_reserve_stays_selectable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22, item 5: a graceful stop hands its partitions off by default; operators who
    prefer no moves ask for reserve in the file or with DS_HOLD_MODE."""
    monkeypatch.delenv("DS_HOLD_MODE", raising=False)
    assert load_settings(AssignerSettings, {}, None).hold_mode == "handoff"
    config = tmp_path / "a.yaml"
    config.write_text("hold_mode: reserve\n")
    assert load_settings(AssignerSettings, {}, config).hold_mode == "reserve"
    monkeypatch.setenv("DS_HOLD_MODE", "reserve")
    assert load_settings(AssignerSettings, {}, None).hold_mode == "reserve"
    monkeypatch.setenv("DS_HOLD_MODE", "wait")
    with pytest.raises(ConfigError, match="hold_mode"):
        load_settings(AssignerSettings, {}, None)
