"""The sidecar RPC e2e tests' helpers: a mesh started for one topic, the epochs a sidecar holds,
retrying while a lease is not ready yet, and a call expected to fail."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient.reasons import error_info
from tests.support.mesh import Mesh, ServiceProcess

PARTITIONS = 12  # as produce() in the walking skeleton


T = TypeVar("T")


def start(mesh: Mesh, topic: str) -> tuple[str, ServiceProcess]:
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "sidecar-rpc")
    sidecar.wait_serving()
    return group, sidecar


def status_of(err: grpc.RpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    info = error_info(err)
    assert info is not None, f"no ErrorInfo: {err}"
    return err.code(), info.reason, dict(info.metadata)


def failing(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return status_of(caught.value)


def held_epochs(stub: stream_pb2_grpc.StreamServiceStub, timeout: float = 60) -> dict[int, int]:
    """partition → lease epoch, once the sidecar holds every partition."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = stub.Status(stream_pb2.StatusRequest(), timeout=5)
        if len(status.partitions) == PARTITIONS and all(p.position >= 0 for p in status.partitions):
            return {p.partition: p.lease_epoch for p in status.partitions}
        time.sleep(0.2)
    raise AssertionError("the sidecar did not get every partition")


def retry_not_ready(call: Callable[[], T], timeout: float = 30) -> T:
    """A lease just granted answers NOT_HELD ("retry shortly") until fetching is set up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def assigner_of(mesh: Mesh) -> str:
    return next(s for s in mesh.services if s.kind == "assigner").grpc_addr
