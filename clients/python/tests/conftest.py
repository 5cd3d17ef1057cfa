"""The client's tests' shared fixtures."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short private directory (a socket path has at most 107 bytes; tmp_path is long)."""
    path = Path(tempfile.mkdtemp(prefix="ds-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
