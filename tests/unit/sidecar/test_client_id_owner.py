"""A reader's client id is bound to its identity (issue 37, finding 12): the first
identity to use a client id of the group holds it, and another identity naming it is
refused (``PERMISSION_DENIED``, metadata ``permission`` ``client_id:ID``), so one reader
of a group cannot Nack, Ack or take over another's records by claiming its client id. On
the real servicer behind the authorization interceptor (``stream_harness``).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import grpc.aio

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from tests.unit.auth_support import as_identity, static_auth
from tests.unit.sidecar.stream_harness import GROUP, Sidecar, fetch_request, reason_of, run

IDENTITIES = {"reader-a": [f"reader:{GROUP}"], "reader-b": [f"reader:{GROUP}"]}


def test_another_reader_cannot_nack_records_under_a_client_id_it_does_not_hold(
    tmp_path: Path,
) -> None:
    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        part = sc.hold(0, epoch=1)
        sc.buffer(0, range(5))
        got = await stub.Fetch(fetch_request(client_id="app-1"), metadata=as_identity("reader-a"))
        assert len(got.records) == 5
        nack = stream_pb2.NackRequest(client_id="app-1", group=GROUP, all=True)
        nack.delay.FromSeconds(12 * 3600)
        try:
            answer = await stub.Nack(nack, metadata=as_identity("reader-b"))
            print("reader-b's Nack of app-1's records:", answer)
            raise AssertionError("reader-b nacked reader-a's records")
        except grpc.aio.AioRpcError as err:
            code, reason, metadata = reason_of(err)
            print("reader-b's Nack of app-1's records:", code.name, reason, metadata)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
            assert (metadata["client_id"], metadata["permission"]) == ("app-1", "client_id:app-1")
        assert part.acks.inflight == 5, "still in flight to reader-a's app-1"
        # The holder itself still acks them; its own other client ids are its own.
        ack = stream_pb2.AckRequest(
            client_id="app-1",
            group=GROUP,
            ranges=[
                stream_pb2.RangeAck(
                    topic=got.records[0].topic, partition=0, from_offset=0, to_offset=5,
                    lease_epoch=1,
                )
            ],
        )  # fmt: skip
        acked = await stub.Ack(ack, metadata=as_identity("reader-a"))
        assert acked.acked_count == 1
        await stub.Fetch(fetch_request(client_id="b-1"), metadata=as_identity("reader-b"))

    run(body, auth=static_auth(tmp_path, IDENTITIES))
