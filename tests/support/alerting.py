"""The alerting tests' Alertmanager configuration, written for a receiver of the test's own."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support import prom


def alertmanager_config(sink: prom.WebhookSink) -> dict[str, Any]:
    """The repo's Alertmanager config, webhooks pointed at ``sink`` (same paths) and the
    route's waits shortened for a test."""
    config: dict[str, Any] = yaml.safe_load(prom.ALERTMANAGER_CONFIG.read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            path = "/" + hook["url"].split("/", 3)[3]
            hook["url"] = sink.url(path)
    config["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    return config
