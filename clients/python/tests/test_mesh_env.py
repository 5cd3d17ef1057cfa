"""What an injected application reads to find the mesh (clients/python/src/dsclient/mesh_env.py)."""

from __future__ import annotations

import socket

import pytest

from dsclient.mesh_env import MeshEnv


def test_read_what_the_injector_writes() -> None:
    env = MeshEnv.read(
        {
            "DS_SIDECAR": "127.0.0.1:7080",
            "DS_GROUP": "orders",
            "DS_ASSIGNER": "ds-assigner.dataservice.svc:7070",
            "DS_CLIENT_ID": "orders-1",
        }
    )
    assert env == MeshEnv(
        group="orders",
        assigner="ds-assigner.dataservice.svc:7070",
        consul=None,
        sidecar="127.0.0.1:7080",
        client_id="orders-1",
    )


def test_defaults() -> None:
    env = MeshEnv.read({"DS_GROUP": "g", "DS_CONSUL": "10.0.0.1:8500"})
    assert env.assigner == "127.0.0.1:7070"
    assert env.consul == "10.0.0.1:8500"
    assert env.client_id == socket.gethostname()


@pytest.mark.parametrize("environ", [{}, {"DS_GROUP": "  "}])
def test_the_group_is_required(environ: dict[str, str]) -> None:
    with pytest.raises(KeyError, match="DS_GROUP"):
        MeshEnv.read(environ)
