"""The compose stack for tests/compose: images built (or loaded from the cache), then
``podman-compose up`` of deploy/docker-compose.yml with three files swapped for the test's
(the repo's rules with every ``for:`` at 2s, Prometheus scraping every 2s, Alertmanager's
webhooks pointed at a sink in this process and its waits shortened); the tests share it,
in file order, and the last one takes it down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from services.devstack import compose, images
from tests.compose.stack import Received, Stack
from tests.support import prom
from tests.support.alerting import alertmanager_config

REPO = Path(__file__).resolve().parents[2]


def _readable(path: Path) -> Path:
    """Containers run as non-root users: the files they mount must be world-readable."""
    path.chmod(0o755 if path.is_dir() else 0o644)
    return path


def _test_configs(directory: Path, sink: prom.WebhookSink) -> dict[str, str]:
    rules = directory / "rules"
    for file in prom.fast_rule_files(rules, "2s"):
        _readable(file)
    _readable(rules)
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus-compose.yml").read_text())
    config["global"].update(scrape_interval="2s", evaluation_interval="2s")
    prometheus = directory / "prometheus.yml"
    prometheus.write_text(yaml.safe_dump(config))
    alertmanager = directory / "alertmanager.yml"
    alertmanager.write_text(yaml.safe_dump(alertmanager_config(sink)))
    return {
        "DS_PROMETHEUS_RULES": str(rules),
        "DS_PROMETHEUS_CONFIG": str(_readable(prometheus)),
        "DS_ALERTMANAGER_CONFIG": str(_readable(alertmanager)),
    }


@pytest.fixture(scope="session")
def webhook_sink() -> Iterator[prom.WebhookSink]:
    with prom.WebhookSink() as sink:
        yield sink


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, webhook_sink: prom.WebhookSink
) -> Iterator[Stack]:
    started = time.monotonic()
    images.ensure_images(report=lambda line: print(line, flush=True))
    if compose.containers():  # a stack left by a run that was killed
        compose.down()
    directory = tmp_path_factory.mktemp("compose")
    _readable(directory)
    env = _test_configs(directory, webhook_sink)
    volumes_before = compose.volumes()
    try:
        up = time.monotonic()
        compose.up(env=env)
        print(
            f"compose: images {up - started:.0f}s, up and healthy {time.monotonic() - up:.0f}s",
            flush=True,
        )
        yield Stack(volumes_before)
    finally:
        if compose.containers():  # the last test takes it down; this is for failures
            compose.down(env=env)


@pytest.fixture(scope="session")
def received(stack: Stack) -> Received:
    return Received()
