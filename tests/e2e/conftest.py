"""tests/e2e fixtures (the shared ones, Kafka, Consul and the mesh, are in tests/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import assigner_state
from tests.support.mesh import Mesh


@pytest.fixture
def own_state(mesh: Mesh) -> Iterator[dict[str, str]]:
    """The assigner's own state topic and transactional id (the shared broker's other
    assigners would fence the default one): tests/support/assigner_state.py."""
    with assigner_state.own_state(mesh.bootstrap) as env:
        yield env


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory (a socket path has at most 107 bytes; pytest's tmp_path is long)."""
    path = Path(tempfile.mkdtemp(prefix="ds-uds-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
