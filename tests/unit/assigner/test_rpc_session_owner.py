"""A sidecar id's Session and Leave belong to the identity that holds its live session
(issue 37, finding 4), on the real servicers behind the authorization interceptor.

The policy may let two identities name one sidecar id (a misconfiguration, or a stolen
role); the live session's holder keeps it: the other is refused the Session
(``SESSION_HELD``), and since issue 37 its ``Leave`` too, which used to end the holder's
membership and move its partitions.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from dataservice.assigner.v1 import assigner_pb2
from tests.unit.assigner.rpc_harness import (
    Assigner,
    Sidecar,
    join,
    reason_of,
    refused,
    run,
    stream_refused,
)
from tests.unit.auth_support import as_identity, static_auth

IDENTITIES = {
    "sc-1": ["sidecar", "serves:g", "endpoint:*.pod"],
    "intruder": ["sidecar:sc-1", "serves:g", "endpoint:*.pod"],
    "ops": ["admin"],
}


def test_leave_by_another_identity_than_the_live_sessions_is_refused(tmp_path: Path) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        holder = Sidecar(a.sessions, "sc-1", identity="sc-1")
        await holder.join("g")
        grants = await holder.grants(4)
        await holder.heartbeat(grants)
        intruder = Sidecar(a.sessions, "sc-1", identity="intruder")
        await intruder.call.write(join("sc-1", "g"))
        code, reason, _ = reason_of(await stream_refused(intruder.call))
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "SESSION_HELD")
        leave = assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="g", graceful=False)
        err = await refused(a.sessions.Leave(leave, metadata=as_identity("intruder")))
        code, reason, metadata = reason_of(err)
        print("intruder's Leave of sc-1 while sc-1 holds its session:", code.name, reason)
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "SESSION_HELD")
        assert metadata["sidecar_id"] == "sc-1"
        group = a.groups.group("g")
        assert "sc-1" in group.coordinator.members
        assert {lease.holder for lease in group.coordinator.leases.values()} == {"sc-1"}
        # The holder itself may leave.
        await a.sessions.Leave(
            assigner_pb2.LeaveRequest(sidecar_id="sc-1", group="g", graceful=True),
            metadata=as_identity("sc-1"),
        )
        await holder.close()

    run(body, auth=static_auth(tmp_path, IDENTITIES))
