"""dsctl's gRPC edge: status → exit code mapping, leader following, unreachable services.

In-process AdminService servers on port 0 stand in for a leader and a follower assigner.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_status import rpc_status

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dsclient.reasons import LEADER_METADATA_KEY, DsError, Reason
from services.devstack.ports import free_port
from services.dsctl.admin_client import (
    AssignerClient,
    CliError,
    ExitCode,
    FaultFilter,
    NotifierClient,
    assigner_endpoint,
    classify,
)

WHERE = assigner_endpoint("10.0.0.1:7070")


class _Status(
    collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status
):
    pass


def test_unreachable_names_the_address_and_what_to_check() -> None:
    err = classify(grpc.StatusCode.UNAVAILABLE, "failed to connect", None, WHERE)
    assert err.exit_code is ExitCode.UNAVAILABLE
    assert "assigner at 10.0.0.1:7070 is unreachable" in err.message
    assert "--assigner" in err.message and "DS_ASSIGNER" in err.message


def test_deadline_is_unavailable() -> None:
    err = classify(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", None, WHERE)
    assert err.exit_code is ExitCode.UNAVAILABLE
    assert "did not answer in time" in err.message


def test_service_side_unavailable_keeps_its_reason() -> None:
    err = classify(grpc.StatusCode.UNAVAILABLE, "kafka down", Reason.KAFKA_UNAVAILABLE, WHERE)
    assert err.exit_code is ExitCode.UNAVAILABLE
    assert "[KAFKA_UNAVAILABLE]" in err.message and "kafka down" in err.message


def test_not_found_is_exit_2() -> None:
    err = classify(grpc.StatusCode.NOT_FOUND, "group 'x' does not exist",
                   Reason.GROUP_NOT_FOUND, WHERE)  # fmt: skip
    assert err.exit_code is ExitCode.NOT_FOUND
    assert "GROUP_NOT_FOUND" in err.message and "'x'" in err.message


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.INTERNAL]
)  # fmt: skip
def test_other_errors_are_exit_1(code: grpc.StatusCode) -> None:
    err = classify(code, "nope", None, WHERE)
    assert err.exit_code is ExitCode.ERROR and code.name in err.message


def test_follower_without_leader_is_unavailable() -> None:
    err = classify(grpc.StatusCode.FAILED_PRECONDITION, "not the leader", Reason.NOT_LEADER, WHERE)
    assert err.exit_code is ExitCode.UNAVAILABLE


class Leader(admin_pb2_grpc.AdminServiceServicer):
    """Two pages of groups; DescribeGroup knows only "known"."""

    def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ListGroupsResponse:
        if request.page_token == "":
            return admin_pb2.ListGroupsResponse(
                groups=[admin_pb2.GroupSummary(config=types_pb2.GroupConfig(name="a"))],
                next_page_token="after-a",
            )
        assert request.page_token == "after-a"
        return admin_pb2.ListGroupsResponse(
            groups=[admin_pb2.GroupSummary(config=types_pb2.GroupConfig(name="known"))]
        )

    def DescribeGroup(
        self, request: admin_pb2.DescribeGroupRequest, context: grpc.ServicerContext
    ) -> admin_pb2.DescribeGroupResponse:
        if request.group != "known":
            err = DsError(Reason.GROUP_NOT_FOUND, f"group {request.group!r} does not exist")
            context.abort_with_status(rpc_status.to_status(err.to_status()))
        return admin_pb2.DescribeGroupResponse(config=types_pb2.GroupConfig(name="known"))


class Follower(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, leader: str) -> None:
        self.leader = leader

    def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ListGroupsResponse:
        err = DsError(Reason.NOT_LEADER, "this assigner is a follower")
        status = rpc_status.to_status(err.to_status())
        context.abort_with_status(
            _Status(
                status.code,
                status.details,
                (*status.trailing_metadata, (LEADER_METADATA_KEY, self.leader)),
            )
        )
        raise AssertionError("unreachable")


def serve(servicer: admin_pb2_grpc.AdminServiceServicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def leader() -> Iterator[str]:
    server, address = serve(Leader())
    yield address
    server.stop(None)


def test_lists_every_page(leader: str) -> None:
    with AssignerClient(leader, timeout=5) as client:
        assert [g.config.name for g in client.list_groups()] == ["a", "known"]


def test_follows_the_leader_named_by_a_follower(leader: str) -> None:
    server, follower = serve(Follower(leader))
    try:
        with AssignerClient(follower, timeout=5) as client:
            assert [g.config.name for g in client.list_groups()] == ["a", "known"]
            assert client.endpoint.address == leader
    finally:
        server.stop(None)


def test_unknown_group_is_not_found_and_all_groups_skip_it(leader: str) -> None:
    with AssignerClient(leader, timeout=5) as client:
        with pytest.raises(CliError) as excinfo:
            client.describe("missing")
        assert excinfo.value.exit_code is ExitCode.NOT_FOUND
        assert "GROUP_NOT_FOUND" in excinfo.value.message
        # Listing all groups: "a" vanished between ListGroups and DescribeGroup.
        assert [d.config.name for d in client.describe_groups(None)] == ["known"]


def test_nothing_listening_is_unavailable_with_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    with AssignerClient(address, timeout=5) as client, pytest.raises(CliError) as excinfo:
        client.list_groups()
    assert excinfo.value.exit_code is ExitCode.UNAVAILABLE
    assert f"assigner at {address} is unreachable" in excinfo.value.message
    with NotifierClient(address, timeout=5) as notifier, pytest.raises(CliError) as excinfo:
        notifier.list_faults(FaultFilter(), 10)
    assert f"notifier at {address} is unreachable" in excinfo.value.message
    assert "--notifier" in excinfo.value.message
