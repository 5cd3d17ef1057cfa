"""``dsctl handoff``: hand a running sidecar's leases off and wait until it holds none.

The preStop hook of every injected sidecar (services/injector/patch.py). It asks the local
sidecar who it is (``Status``), then asks the assigner to let it leave gracefully (``Leave``,
following ``ds-leader`` to the leader): the assigner revokes every lease, and the sidecar —
still up and serving acks — drains, commits and releases each partition the cooperative way
(ARCHITECTURE §3.1.5). The command returns once ``Status`` lists no partition, so the
kubelet's SIGTERM that follows finds nothing left to hand off. If it cannot finish in time,
SIGTERM's own graceful stop releases what is left (committing acked offsets).

In kafka_group mode Kafka's coordinator owns the partitions: there is nothing to hand off
through the assigner, and SIGTERM hands them back to Kafka.

The hook runs ``python -m services.dsctl.handoff`` (:func:`main`, the same as ``dsctl
handoff``): it imports only what it uses, so it starts in a fraction of the time the whole
CLI takes, time that would come off the pod's grace period.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc

from dataservice.assigner.v1 import assigner_pb2, assigner_pb2_grpc
from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import local_socket, mesh_env
from dsclient.connection import FOLLOW_ONCE, AssignerTarget, LeaderFollower, open_channel
from dsclient.reasons import LEADER_METADATA_KEY, Reason, error_info, trailing_value
from services.dsctl.admin_client import (
    DEFAULT_ASSIGNER,
    CliError,
    Endpoint,
    ExitCode,
    assigner_endpoint,
    classify_rpc_error,
)
from services.dsctl.connection import connection, sidecar_connection
from services.runtime.settings import OneLineArgumentParser

POLL_SECONDS = 0.2
CALL_TIMEOUT_SECONDS = 5.0


def default_sidecar(environ: Mapping[str, str]) -> str:
    """Where the hook finds its sidecar: the socket of the pod when the sidecar's env names
    one (``DS_UDS_DIR`` and ``DS_ID``: the hook runs in the sidecar's container, with its
    env; a sidecar taking tokens on its socket only refuses them on TCP), else its TCP port
    on loopback (``DS_GRPC_PORT``, 7080)."""
    uds_dir, sidecar_id = environ.get(mesh_env.UDS_DIR), environ.get("DS_ID")
    if uds_dir and sidecar_id:
        directory = Path(uds_dir) / local_socket.sidecar_directory_name(sidecar_id)
        return local_socket.target(directory / local_socket.sidecar_file_name(sidecar_id))
    return f"127.0.0.1:{environ.get('DS_GRPC_PORT') or 7080}"


def sidecar_endpoint(address: str) -> Endpoint:
    return Endpoint("sidecar", address, "--sidecar", "DS_SIDECAR")


def status(sidecar: str) -> stream_pb2.StatusResponse:
    with open_channel(sidecar, sidecar_connection()) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        try:
            return stub.Status(stream_pb2.StatusRequest(), timeout=CALL_TIMEOUT_SECONDS)
        except grpc.RpcError as err:
            raise classify_rpc_error(err, sidecar_endpoint(sidecar)) from None


def leave(assigner: str, sidecar_id: str, group: str) -> bool:
    """Graceful Leave of ``sidecar_id`` at the leader; False if it is not a member (it
    never joined, or has left already)."""
    request = assigner_pb2.LeaveRequest(sidecar_id=sidecar_id, group=group, graceful=True)
    assigner_at = LeaderFollower(AssignerTarget((assigner,)), connection())
    try:
        assigner_at.call(
            assigner_pb2_grpc.AssignerServiceStub,
            lambda stub: stub.Leave(request, timeout=CALL_TIMEOUT_SECONDS),
            FOLLOW_ONCE,  # the instance named, then the leader it names
        )
        return True
    except grpc.RpcError as err:
        info = error_info(err)
        if info is not None and info.reason == Reason.SIDECAR_NOT_FOUND:
            return False
        address = assigner_at.address
        if trailing_value(err, LEADER_METADATA_KEY) not in (None, "", address):
            raise CliError(
                f"assigner leadership is moving (last asked {address}); retry",
                ExitCode.UNAVAILABLE,
            ) from None
        raise classify_rpc_error(err, assigner_endpoint(address)) from None
    finally:
        assigner_at.close()


def handoff(sidecar: str, assigner: str, timeout: float, say: Callable[[str], None]) -> None:
    """Hand off every lease of the sidecar at ``sidecar``; CliError if it did not finish."""
    before = status(sidecar)
    if before.mode == common_pb2.GROUP_MODE_KAFKA_GROUP:
        say(f"{before.sidecar_id}: kafka_group mode; SIGTERM hands its partitions to Kafka")
        return
    if not leave(assigner, before.sidecar_id, before.group):
        say(f"{before.sidecar_id} is not a member of group {before.group}: nothing to hand off")
        return
    say(
        f"{before.sidecar_id} leaves group {before.group}: handing off "
        f"{len(before.partitions)} partition(s)"
    )
    deadline = time.monotonic() + timeout
    while True:
        held = len(status(sidecar).partitions)
        if held == 0:
            say(f"{before.sidecar_id} handed every partition off")
            return
        if time.monotonic() >= deadline:
            raise CliError(
                f"{before.sidecar_id} still holds {held} partition(s) after {timeout:g} s; "
                "its SIGTERM stop releases them",
                ExitCode.UNAVAILABLE,
            )
        time.sleep(POLL_SECONDS)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m services.dsctl.handoff``: exit 0 when handed off (or nothing to do), 3
    when the sidecar or the assigner cannot be reached or the time is up, 1 on bad flags."""
    parser = OneLineArgumentParser(
        prog="python -m services.dsctl.handoff",
        description="Hand a running sidecar's leases off and wait until it holds none.",
    )
    parser.add_argument(
        "--sidecar",
        default=default_sidecar(os.environ),
        help="its gRPC HOST:PORT or unix:PATH (default: its socket, from DS_UDS_DIR and DS_ID, "
        "else 127.0.0.1:DS_GRPC_PORT)",
    )
    parser.add_argument(
        "--assigner",
        default=os.environ.get("DS_ASSIGNER", DEFAULT_ASSIGNER),
        help="assigner gRPC HOST:PORT (DS_ASSIGNER)",
    )
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds to wait")
    args = parser.parse_args(argv)
    try:
        handoff(args.sidecar, args.assigner, args.timeout, lambda m: print(m, file=sys.stderr))
    except CliError as err:
        print(f"error: {err.message}", file=sys.stderr)
        raise SystemExit(int(err.exit_code)) from None


if __name__ == "__main__":
    main()
