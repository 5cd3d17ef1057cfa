"""Fixtures for tests that run the mesh's services as real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mesh import Mesh, running_mesh


@pytest.fixture
def mesh(kafka_cluster: object, tmp_path: Path) -> Iterator[Mesh]:
    """A Mesh on the session's Kafka; every service it started is stopped after the test."""
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as m:  # type: ignore[attr-defined]
        yield m
