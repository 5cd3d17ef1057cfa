"""Fixtures for the Spark tests: the mesh as real processes on the session's Kafka."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.devstack.kafka import KafkaHandle
from tests.support.mesh import Mesh, running_mesh


@pytest.fixture
def mesh(kafka_cluster: KafkaHandle, tmp_path: Path) -> Iterator[Mesh]:
    """A Mesh on the session's Kafka; every service it started is stopped after the test."""
    with running_mesh(kafka_cluster.bootstrap, tmp_path) as m:
        yield m
