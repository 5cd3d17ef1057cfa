"""Running ``dsctl`` as the tests' subprocess: the one wrapper (it was written again in
eight test modules, each with its own timeout and environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from tests.support.mesh import REPO


def cli_env(**overrides: str) -> dict[str, str]:
    """This process's environment with ``overrides`` set, and ``COLUMNS=200`` (tables are
    not wrapped to a terminal's width) unless overridden."""
    return {**os.environ, "COLUMNS": "200", **overrides}


def dsctl(
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``python -m services.dsctl ARGS`` from the repository root, its output captured as
    text; ``env`` is its whole environment (default :func:`cli_env`). Never raises on a
    non-zero exit: the tests look at the return code."""
    return subprocess.run(
        [sys.executable, "-m", "services.dsctl", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False,
        env=dict(env) if env is not None else cli_env(),
    )  # fmt: skip
