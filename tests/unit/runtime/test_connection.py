"""The leader followers against in-process ``grpc.aio`` servers on port 0 that play a
follower assigner (``NOT_LEADER`` naming the leader, or not yet), a leader, and a replica
failing for a while. Both flavours: :class:`LeaderFollower` from this thread,
:class:`AioLeaderFollower` from an event loop of its own (``asyncio.run``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dsclient.connection.aio_follower import AioLeaderFollower
from dsclient.connection.channels import open_channel
from dsclient.connection.follower import LeaderFollower, retry_call
from dsclient.connection.policy import FOLLOW_ONCE, Backoff, CallPolicy
from dsclient.connection.settings import ConnectionSettings
from dsclient.connection.targets import AssignerTarget, LeaderUnknown
from dsclient.reasons import LEADER_METADATA_KEY, DsError, Reason, error_info
from services.devstack.ports import free_port
from services.runtime.error_interceptor import abort

QUICK = CallPolicy(attempts=6, backoff=Backoff(0.01, 0.05))
NO_GRPC_RETRIES = ConnectionSettings(retry=None)
REQUEST = admin_pb2.ListGroupsRequest()

# What a scripted replica answers, call after call (the last answer repeats).
Answer = str | DsError | grpc.StatusCode
OK = "ok"


def not_leader(leader: str | None = None) -> DsError:
    trailing = {LEADER_METADATA_KEY: leader} if leader else None
    return DsError(Reason.NOT_LEADER, "this assigner is a follower", trailing=trailing)


class Replica(admin_pb2_grpc.AdminServiceServicer):
    """An assigner replica whose ListGroups answers as scripted; it counts the calls."""

    def __init__(self, name: str, *answers: Answer) -> None:
        self.name = name
        self.answers = list(answers) or [OK]
        self.calls = 0

    async def ListGroups(
        self, request: admin_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> admin_pb2.ListGroupsResponse:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, DsError):
            await abort(context, answer)
        if isinstance(answer, grpc.StatusCode):
            await context.abort(answer, f"{self.name} says {answer.name}")
        return admin_pb2.ListGroupsResponse(
            groups=[admin_pb2.GroupSummary(config=types_pb2.GroupConfig(name=self.name))]
        )


class Servers:
    """grpc.aio servers on a loop of their own, on a thread of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[grpc.aio.Server] = []

    def serve(self, replica: Replica) -> str:
        async def start() -> int:
            server = grpc.aio.server()
            admin_pb2_grpc.add_AdminServiceServicer_to_server(replica, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self.servers.append(server)
            return port

        return f"127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), self.loop).result()}"

    def close(self) -> None:
        for server in self.servers:
            asyncio.run_coroutine_threadsafe(server.stop(None), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


Admin = admin_pb2_grpc.AdminServiceStub


def list_groups(stub: Admin) -> str:
    return str(stub.ListGroups(REQUEST, timeout=5).groups[0].config.name)


async def aio_list_groups(stub: Admin) -> str:
    response = await stub.ListGroups(REQUEST, timeout=5)  # type: ignore[misc]
    return str(response.groups[0].config.name)


def follower_of(*addresses: str, settings: ConnectionSettings | None = None) -> LeaderFollower:
    return LeaderFollower(AssignerTarget(addresses), settings or ConnectionSettings())


def counted(fn: Callable[[Admin], str]) -> tuple[Callable[[Admin], str], list[int]]:
    invocations: list[int] = []

    def wrapped(stub: Admin) -> str:
        invocations.append(1)
        return fn(stub)

    return wrapped, invocations


# ---- threads ----------------------------------------------------------------------------


def test_a_follower_redirects_the_call_to_the_leader(servers: Servers) -> None:
    leader = Replica("leader")
    leader_address = servers.serve(leader)
    follower = Replica("follower", not_leader(leader_address))
    switched: list[str] = []
    assigner = follower_of(servers.serve(follower))
    assigner.on_leader_change(switched.append)
    try:
        assert assigner.call(Admin, list_groups, QUICK) == "leader"
        assert assigner.address == leader_address and switched == [leader_address]
        assert (follower.calls, leader.calls) == (1, 1)
        assert assigner.call(Admin, list_groups, QUICK) == "leader"  # and stays there
        assert follower.calls == 1
    finally:
        assigner.close()


def test_an_election_in_progress_is_waited_out(servers: Servers) -> None:
    replica = Replica("new-leader", not_leader(), not_leader(), OK)
    assigner = follower_of(servers.serve(replica))
    try:
        assert assigner.call(Admin, list_groups, QUICK) == "new-leader"
        assert replica.calls == 3
    finally:
        assigner.close()


def test_grpc_retries_unavailable_by_itself(servers: Servers) -> None:
    replica = Replica("r", grpc.StatusCode.UNAVAILABLE, OK)
    assigner = follower_of(servers.serve(replica))
    fn, invocations = counted(list_groups)
    try:
        assert assigner.call(Admin, fn, QUICK) == "r"
        assert replica.calls == 2 and len(invocations) == 1  # the channel's service config
    finally:
        assigner.close()


def test_unavailable_is_retried_with_backoff(servers: Servers) -> None:
    replica = Replica("r", grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE, OK)
    assigner = follower_of(servers.serve(replica), settings=NO_GRPC_RETRIES)
    fn, invocations = counted(list_groups)
    try:
        assert assigner.call(Admin, fn, QUICK) == "r"
        assert replica.calls == 3 and len(invocations) == 3
    finally:
        assigner.close()


def test_other_statuses_are_raised_at_once(servers: Servers) -> None:
    invalid = DsError(Reason.INVALID_FIELD, "page_size: too large", metadata={"field": "x"})
    replica = Replica("r", invalid)
    assigner = follower_of(servers.serve(replica))
    try:
        with pytest.raises(grpc.RpcError) as excinfo:
            assigner.call(Admin, list_groups, QUICK)
        assert excinfo.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        info = error_info(excinfo.value)
        assert info is not None and info.reason == Reason.INVALID_FIELD.value
        assert replica.calls == 1
    finally:
        assigner.close()


def test_follow_once_reports_a_second_redirect(servers: Servers) -> None:
    leader_address = servers.serve(Replica("leader"))
    second_address = servers.serve(Replica("second", not_leader(leader_address)))
    first = Replica("first", not_leader(second_address))
    assigner = follower_of(servers.serve(first))
    try:
        with pytest.raises(grpc.RpcError) as excinfo:
            assigner.call(Admin, list_groups, FOLLOW_ONCE)
        assert excinfo.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        assert assigner.address == second_address  # the one that answered last
        assert assigner.call(Admin, list_groups, QUICK) == "leader"
    finally:
        assigner.close()


def test_the_attempt_budget_ends_an_endless_election(servers: Servers) -> None:
    replica = Replica("r", not_leader())
    assigner = follower_of(servers.serve(replica))
    try:
        with pytest.raises(grpc.RpcError):
            assigner.call(Admin, list_groups, CallPolicy(attempts=3, backoff=Backoff(0.01, 0.01)))
        assert replica.calls == 3
    finally:
        assigner.close()


def test_the_next_replica_is_tried_after_a_dead_one(servers: Servers) -> None:
    dead = f"127.0.0.1:{free_port()}"
    live = servers.serve(Replica("live"))
    assigner = follower_of(dead, live, settings=NO_GRPC_RETRIES)
    try:
        assert assigner.call(Admin, list_groups, QUICK) == "live"
        assert assigner.address == live
    finally:
        assigner.close()


def test_a_call_whose_channel_is_replaced_under_it_goes_again_on_the_new_one(
    servers: Servers,
) -> None:
    old_address = servers.serve(Replica("old"))
    new_address = servers.serve(Replica("new"))
    assigner = follower_of(old_address)

    def switched_meanwhile(stub: Admin) -> str:
        if assigner.address == old_address:
            assigner.switch(new_address)  # another thread learnt of a new leader
        return list_groups(stub)  # its channel is closed by now

    try:
        assert assigner.call(Admin, switched_meanwhile, FOLLOW_ONCE) == "new"
    finally:
        assigner.close()


def test_a_closed_follower_refuses_calls_and_an_unknown_leader_is_said(servers: Servers) -> None:
    assigner = follower_of(servers.serve(Replica("r")))
    assigner.close()
    with pytest.raises(ValueError, match="closed"):
        assigner.call(Admin, list_groups, QUICK)
    consul_only = LeaderFollower(AssignerTarget((), consul="127.0.0.1:1"))
    with pytest.raises(LeaderUnknown):
        consul_only.stub(Admin)


def test_retry_call_retries_a_peer_that_is_not_followed(servers: Servers) -> None:
    replica = Replica("sidecar", grpc.StatusCode.UNAVAILABLE, OK)
    channel = open_channel(servers.serve(replica), NO_GRPC_RETRIES)
    try:
        stub = Admin(channel)
        assert retry_call(lambda: list_groups(stub), QUICK) == "sidecar"
        assert replica.calls == 2
    finally:
        channel.close()


# ---- asyncio ----------------------------------------------------------------------------


def aio_follower_of(
    *addresses: str, settings: ConnectionSettings | None = None
) -> AioLeaderFollower:
    return AioLeaderFollower(AssignerTarget(addresses), settings or ConnectionSettings())


def test_aio_a_follower_redirects_the_call_to_the_leader(servers: Servers) -> None:
    leader_address = servers.serve(Replica("leader"))
    follower = Replica("follower", not_leader(leader_address))
    follower_address = servers.serve(follower)

    async def scenario() -> None:
        switched: list[str] = []
        assigner = aio_follower_of(follower_address)
        assigner.on_leader_change(switched.append)
        try:
            assert await assigner.call(Admin, aio_list_groups, QUICK) == "leader"
            assert assigner.address == leader_address and switched == [leader_address]
        finally:
            await assigner.close()

    asyncio.run(scenario())
    assert follower.calls == 1


def test_aio_an_election_then_unavailable_are_retried(servers: Servers) -> None:
    replica = Replica("r", not_leader(), grpc.StatusCode.UNAVAILABLE, OK)
    address = servers.serve(replica)

    async def scenario() -> str:
        assigner = aio_follower_of(address, settings=NO_GRPC_RETRIES)
        try:
            return await assigner.call(Admin, aio_list_groups, QUICK)
        finally:
            await assigner.close()

    assert asyncio.run(scenario()) == "r"
    assert replica.calls == 3


def test_aio_other_statuses_are_raised_at_once(servers: Servers) -> None:
    replica = Replica("r", grpc.StatusCode.INVALID_ARGUMENT)
    address = servers.serve(replica)

    async def scenario() -> None:
        assigner = aio_follower_of(address)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await assigner.call(Admin, aio_list_groups, QUICK)
            assert excinfo.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        finally:
            await assigner.close()

    asyncio.run(scenario())
    assert replica.calls == 1


def test_aio_a_stream_loop_follows_the_leader_it_is_told_of(servers: Servers) -> None:
    """What the sidecar's session does with a failed stream: ``follow`` it."""
    leader_address = servers.serve(Replica("leader"))
    follower_address = servers.serve(Replica("follower", not_leader(leader_address)))

    async def scenario() -> None:
        assigner = aio_follower_of(follower_address)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                await aio_list_groups(assigner.stub(Admin))
            assert await assigner.follow(excinfo.value)
            assert not await assigner.follow(excinfo.value)  # already there
            assert await aio_list_groups(assigner.stub(Admin)) == "leader"
        finally:
            await assigner.close()

    asyncio.run(scenario())
