"""What the operations' e2e tests share: ``dsctl`` as a subprocess against a mesh, waiting,
and the record accounting of at-least-once (a record delivered again must have had its
earlier delivery's ack refused or failed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.support.mesh import REPO
from tests.support.records import Tally


def dsctl(assigner: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_ASSIGNER": assigner, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "services.dsctl", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )  # fmt: skip


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s: {what}")


def unexplained_duplicates(tally: Tally) -> dict[int, list[Any]]:
    """Records delivered again although an earlier delivery's ack was accepted."""
    return {
        seq: deliveries
        for seq, deliveries in tally.duplicates().items()
        if any(d.acked for d in deliveries[:-1])
    }
