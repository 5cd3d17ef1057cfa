"""Bad configuration ends a service with exit code 2 and one clear line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SERVICES = ["services.assigner", "services.consumer_sidecar", "services.notifier"]


def run(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base_env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    # The sidecar needs a group; give it one unless the test is about that.
    extra = ["--group", "g"] if module == "services.consumer_sidecar" else []
    return subprocess.run(
        [sys.executable, "-m", module, *extra, *args],
        capture_output=True, text=True, timeout=60, env={**base_env, **(env or {})},
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize("module", SERVICES)
def test_unknown_flag_value(module: str) -> None:
    assert_one_clear_line(run(module, "--log-format", "xml"), "log_format", "xml")


@pytest.mark.parametrize("module", SERVICES)
def test_malformed_bootstrap(module: str) -> None:
    assert_one_clear_line(
        run(module, "--bootstrap", "kafka-without-port"), "bootstrap", "HOST:PORT"
    )


@pytest.mark.parametrize("module", SERVICES)
@pytest.mark.parametrize("port", ["70000", "abc", "-1"])
def test_bad_port(module: str, port: str) -> None:
    assert_one_clear_line(run(module, "--grpc-port", port), "grpc_port")


@pytest.mark.parametrize("module", SERVICES)
def test_unreadable_config_file(module: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_one_clear_line(
        run(module, "--config", str(missing)), "cannot read config file", str(missing)
    )


def test_config_file_that_is_not_yaml(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("groups: [unclosed\n")
    assert_one_clear_line(run("services.assigner", "--config", str(config)), "not valid YAML")


def test_unknown_setting_in_config_file(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("bootstrapp: 127.0.0.1:9092\n")
    assert_one_clear_line(
        run("services.assigner", "--config", str(config)), "bootstrapp", "unknown setting"
    )


def test_bad_value_from_environment() -> None:
    result = run("services.notifier", env={"DS_HTTP_PORT": "not-a-port"})
    assert_one_clear_line(result, "http_port")


def test_unknown_flag() -> None:
    assert_one_clear_line(run("services.assigner", "--no-such-flag"), "unrecognized arguments")


def test_sidecar_needs_a_group() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.consumer_sidecar"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert_one_clear_line(result, "group")


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    """Precedence, checked on the loaded model (no process needed)."""
    from services.notifier.settings import NotifierSettings
    from services.runtime.settings import load_settings

    config = tmp_path / "n.yaml"
    config.write_text("grpc_port: 1111\nhttp_port: 2222\nlog_level: debug\n")
    import os

    os.environ["DS_HTTP_PORT"] = "3333"
    os.environ["DS_LOG_LEVEL"] = "warning"
    try:
        settings = load_settings(NotifierSettings, {"log_level": "error"}, config)
    finally:
        del os.environ["DS_HTTP_PORT"], os.environ["DS_LOG_LEVEL"]
    assert settings.grpc_port == 1111  # file only
    assert settings.http_port == 3333  # env beats file
    assert settings.log_level == "error"  # flag beats env
