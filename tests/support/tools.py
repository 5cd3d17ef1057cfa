"""Locate (building if needed) the Go tools the tests drive: grpcurl."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from services.devstack.cache import cache_dir

REPO = Path(__file__).resolve().parents[2]


def grpcurl_binary() -> Path:
    """``$DS_GRPCURL_BIN``, else the cached build, else build it (deploy/grpcurl/build.sh)."""
    if env := os.environ.get("DS_GRPCURL_BIN"):
        return Path(env)
    cached = cache_dir() / "bin" / "grpcurl"
    if cached.is_file():
        return cached
    result = subprocess.run(
        ["bash", str(REPO / "deploy" / "grpcurl" / "build.sh")],
        capture_output=True, text=True, check=False, timeout=1200,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(
            f"building grpcurl failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])
