"""Running podman (and podman-compose) with the project's own ``containers.conf``.

Debian's podman needs two settings on these machines (``deploy/container/containers.conf``
says which and why); they are passed with ``CONTAINERS_CONF`` rather than written to /etc,
unless the caller already set that variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "deploy" / "container" / "containers.conf"


class PodmanError(RuntimeError):
    """A podman command failed; the message carries the command and its output's tail."""


def podman_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    env.update(extra or {})
    return env


def require(command: str) -> str:
    """The path of ``command``, or a clear error naming the set-up step that installs it."""
    path = shutil.which(command)
    if path is None:
        raise PodmanError(
            f"'{command}' not found: scripts/setup.sh installs podman, runc and mmdebstrap "
            "(Debian) and podman-compose (the dev extra)"
        )
    return path


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    check: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with the podman environment, output captured as text."""
    result = subprocess.run(
        list(argv),
        env=podman_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )
    if check and result.returncode != 0:
        tail = (result.stdout + result.stderr).strip()[-3000:]
        raise PodmanError(f"{' '.join(argv)} exited with {result.returncode}:\n{tail}")
    return result


def podman(*args: str, timeout: float | None = None, check: bool = True) -> str:
    """``podman ARGS`` → its stdout."""
    return run([require("podman"), *args], timeout=timeout, check=check).stdout
