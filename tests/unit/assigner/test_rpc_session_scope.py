"""A sidecar identity carries its scope (issue 37, finding 1): the groups it may serve
(``serves:GROUP``) and the endpoint it may advertise (``endpoint:HOST``, else the address
its Session comes from). A sidecar credential cannot join another group, receive its
leases and be handed to its clients (and their tokens), nor point a group's clients at a
host of its choosing. On the real servicers behind the authorization interceptor.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from tests.unit.assigner.rpc_harness import (
    Assigner,
    Sidecar,
    join,
    reason_of,
    run,
    stream_refused,
)
from tests.unit.auth_support import static_auth

IDENTITIES = {
    "sc-1": ["sidecar", "serves:g"],
    "sc-2": ["sidecar", "serves:g", "endpoint:sc-2.pod"],
    "sc-any": ["sidecar", "serves:*"],
}


async def session(
    a: Assigner, identity: str, group: str, endpoint: str
) -> tuple[grpc.StatusCode, str, dict[str, str]] | str:
    """The Session's first answer: "accepted", or the refusal's (code, reason, metadata)."""
    sidecar = Sidecar(a.sessions, identity, identity=identity)
    await sidecar.call.write(join(identity, group, endpoint=endpoint))
    try:
        first = await sidecar.next()
        return str(first.WhichOneof("kind"))
    except grpc.aio.AioRpcError as err:
        return reason_of(err)
    finally:
        sidecar.call.cancel()


def test_a_sidecar_identity_joins_only_its_groups_and_advertises_only_its_endpoint(
    tmp_path: Path,
) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        await a.create("other")
        tried = {
            "sc-1 joins other": await session(a, "sc-1", "other", "127.0.0.1:7080"),
            "sc-1 advertises evil.example": await session(a, "sc-1", "g", "evil.example:7080"),
            "sc-2 advertises 10.9.9.9": await session(a, "sc-2", "g", "10.9.9.9:7080"),
        }
        for attack, got in tried.items():
            print(attack, "->", got)
        assert tried["sc-1 joins other"] == (
            grpc.StatusCode.PERMISSION_DENIED,
            "PERMISSION_DENIED",
            {"permission": "serve:other", "identity": "sc-1", "rpc": SESSION},
        )
        for attack, host in (
            ("sc-1 advertises evil.example", "evil.example"),
            ("sc-2 advertises 10.9.9.9", "10.9.9.9"),
        ):
            code, reason, metadata = tried[attack]  # type: ignore[misc]
            assert (code, reason, metadata["permission"]) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "PERMISSION_DENIED",
                f"advertise:{host}",
            ), attack
        # Within scope: its group, from its own address or at a name its policy gives.
        assert await session(a, "sc-1", "g", "127.0.0.1:7080") == "accepted"
        assert await session(a, "sc-2", "g", "sc-2.pod:7080") == "accepted"
        assert await session(a, "sc-any", "other", "127.0.0.1:7081") == "accepted"

    run(body, auth=static_auth(tmp_path, IDENTITIES))


SESSION = "/dataservice.assigner.v1.AssignerService/Session"
_ = stream_refused
