"""``dsctl dev up`` stacks in the e2e tests (test_dsctl_dev, test_dev_secure,
test_dev_secure_consul): the stack uses fixed service ports (ARCHITECTURE §9), so a test
first makes sure they are free, runs ``dsctl`` with a state directory of its own, and at
the end stops the stack and checks that nothing it started is left (no process, no open
port)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
import pytest

from services.devstack.ports import port_is_open
from tests.support import cli

DEV_TIMEOUT_SECONDS = 300  # `dev up` builds what is missing and waits for health


def dsctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return cli.dsctl(*args, env=env, timeout=DEV_TIMEOUT_SECONDS)


def dev_state(env: dict[str, str]) -> dict[str, Any]:
    """What ``dsctl dev status --output json`` says of the running stack."""
    status = dsctl("dev", "status", "--output", "json", env=env)
    assert status.returncode == 0, status.stderr
    state: dict[str, Any] = json.loads(status.stdout)
    return state


def require_free(ports: Iterable[int]) -> None:
    busy = [p for p in ports if port_is_open(p)]
    if busy:
        pytest.fail(f"ports {busy} are in use; stop what runs there (a dev stack?) first")


def dev_env(dev_dir: Path, *, columns: int = 250, plain: bool = False) -> dict[str, str]:
    """This process's environment with the stack's state in ``dev_dir``; ``plain``: without
    the caller's ``DS_TLS__*`` and ``DS_AUTH__*`` (a secure stack prints its own)."""
    env = {**os.environ, "DS_DEV_DIR": str(dev_dir), "COLUMNS": str(columns)}
    if plain:
        for key in [k for k in env if k.startswith(("DS_TLS__", "DS_AUTH__"))]:
            del env[key]
    return env


def left_behind(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie is gone)."""
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def down_and_gone(env: dict[str, str], pids: Iterable[int], ports: Iterable[int] = ()) -> None:
    """``dsctl dev down``; then none of ``pids`` runs and none of ``ports`` is open."""
    down = dsctl("dev", "down", env=env)
    assert down.returncode == 0, down.stderr
    alive = left_behind(pids)
    assert alive == [], f"processes left behind: {alive}"
    still_open = [p for p in ports if port_is_open(p)]
    assert still_open == [], f"ports still open: {still_open}"
