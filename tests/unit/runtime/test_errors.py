"""DsError travels as a canonical status + ErrorInfo through a real in-process gRPC server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import grpc.aio
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.runtime.errors import CATALOGUE, DOMAIN, DsError, Reason, error_info, invalid
from services.runtime.grpcserver import GrpcService, create_server
from services.runtime.settings import ServiceSettings

ERRORS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "errors.md"


class Failing(stream_pb2_grpc.StreamServiceServicer):
    async def Fetch(
        self, request: stream_pb2.FetchRequest, context: object
    ) -> stream_pb2.FetchResponse:
        if not request.client_id:
            raise invalid("client_id", "must not be empty")
        raise DsError(
            Reason.LEASE_EPOCH_STALE,
            "epoch 3 is not the current epoch 4",
            metadata={"topic": "t", "partition": "0"},
            trailing={"ds-leader": "10.0.0.1:7070"},
        )


async def call(request: stream_pb2.FetchRequest) -> grpc.aio.AioRpcError:
    settings = ServiceSettings(grpc_port=0, http_port=0)
    server = create_server(
        settings,
        [
            GrpcService(
                "dataservice.sidecar.v1.StreamService",
                Failing(),
                stream_pb2_grpc.add_StreamServiceServicer_to_server,
            )
        ],
    )
    await server.server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = stream_pb2_grpc.StreamServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Fetch(request, timeout=5)
            return caught.value
    finally:
        await server.server.stop(0)


def test_invalid_field_is_invalid_argument_with_error_info() -> None:
    err = asyncio.run(call(stream_pb2.FetchRequest()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(err)
    assert info is not None
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "INVALID_FIELD",
        DOMAIN,
        {"field": "client_id"},
    )
    assert "client_id" in (err.details() or "")


def test_reason_sets_code_metadata_and_trailing_leader() -> None:
    err = asyncio.run(call(stream_pb2.FetchRequest(client_id="c")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(err)
    assert info is not None and info.reason == "LEASE_EPOCH_STALE"
    assert dict(info.metadata) == {"topic": "t", "partition": "0"}
    trailing = dict(err.trailing_metadata() or ())
    assert trailing.get("ds-leader") == "10.0.0.1:7070"


def test_error_reference_page_matches_the_catalogue() -> None:
    """docs/reference/errors.md (scripts/gen_docs.py) lists every reason with its code."""
    text = ERRORS_PAGE.read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `([A-Z_]+)` \|", text, re.MULTILINE))
    assert rows == {reason.value: spec.code.name for reason, spec in CATALOGUE.items()}
