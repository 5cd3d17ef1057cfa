"""tests/e2e fixtures (the shared ones, Kafka, Consul and the mesh, are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import assigner_state
from tests.support.mesh import Mesh


@pytest.fixture
def own_state(mesh: Mesh) -> Iterator[dict[str, str]]:
    """The assigner's own state topic and transactional id (the shared broker's other
    assigners would fence the default one): tests/support/assigner_state.py."""
    with assigner_state.own_state(mesh.bootstrap) as env:
        yield env
