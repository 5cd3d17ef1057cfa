"""dsctl's gRPC edge: channels to the assigner and notifier, timeouts, error mapping.

Every failed call becomes a :class:`CliError` carrying one of the documented
:class:`ExitCode` values and a one-line message meant for an operator (which address,
what to check), so commands never print a traceback. :func:`classify` is the pure part
(status code + ErrorInfo → exit code and message) and is unit-tested on its own.

A follower assigner answers ``FAILED_PRECONDITION`` / ``NOT_LEADER`` with the leader's
address in trailing metadata ``ds-leader`` (ARCHITECTURE §3); :class:`AssignerClient`
follows it once (the connection module's ``FOLLOW_ONCE``), so pointing dsctl at any
assigner instance works. Channels come from ``dsclient.connection``.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import socket
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import TypeVar

import grpc
from google.protobuf import message

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc
from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2, notifier_pb2_grpc
from dsclient.connection import FOLLOW_ONCE, AssignerTarget, LeaderFollower, open_channel
from dsclient.reasons import Reason, error_info
from services.dsctl.connection import connection

DEFAULT_ASSIGNER = "127.0.0.1:7070"
DEFAULT_NOTIFIER = "127.0.0.1:7090"
DEFAULT_TIMEOUT_SECONDS = 15.0
# Largest page the servers accept (ListGroups, ListFaults); fewer round trips.
MAX_PAGE_SIZE = 1000

R = TypeVar("R", bound=message.Message)


class ExitCode(IntEnum):
    """What dsctl's exit status means; scripts may rely on these (README, ``--help``)."""

    OK = 0
    ERROR = 1  # usage error, bad input, refused request, unexpected server error
    NOT_FOUND = 2  # unknown group (or other named resource)
    UNAVAILABLE = 3  # assigner/notifier unreachable, not ready, or no leader elected
    THRESHOLD = 4  # a --max-lag threshold was exceeded
    # Accepted or stored, but not complete: a move, drain or undrain not done within --wait
    # (it goes on), or a config set not applied by every member (refused, or not in time).
    INCOMPLETE = 5
    NOT_APPLIED = 5  # the same code, as config set names it


EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 usage error, bad input, refused or not confirmed; 2 not found "
    "(unknown group, sidecar); 3 assigner/notifier unreachable or unavailable; 4 lag over "
    "--max-lag; 5 accepted but not complete: a move, drain or undrain not done within --wait "
    "(it goes on), or a config set stored but not applied by every member."
)


class CliError(Exception):
    """A failure to report on stderr, with the exit status to end with."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Which service dsctl talks to, for error messages: ``assigner at 127.0.0.1:7070``."""

    service: str  # "assigner" | "notifier"
    address: str
    flag: str  # "--assigner"
    envvar: str  # "DS_ASSIGNER"

    def __str__(self) -> str:
        return f"{self.service} at {self.address}"


def assigner_endpoint(address: str) -> Endpoint:
    return Endpoint("assigner", address, "--assigner", "DS_ASSIGNER")


def notifier_endpoint(address: str) -> Endpoint:
    return Endpoint("notifier", address, "--notifier", "DS_NOTIFIER")


_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def classify(code: grpc.StatusCode, details: str, reason: str | None, where: Endpoint) -> CliError:
    """The exit code and operator message for a failed call (pure; no I/O)."""
    tag = f" [{reason}]" if reason else ""
    if code in _UNREACHABLE and reason is None:
        what = (
            "did not answer in time"
            if code is grpc.StatusCode.DEADLINE_EXCEEDED
            else ("is unreachable")
        )
        return CliError(
            f"{where} {what} ({details or code.name}). Check that the {where.service} runs "
            f"(`dsctl dev status`) and that {where.flag} / ${where.envvar} names its gRPC "
            "HOST:PORT.",
            ExitCode.UNAVAILABLE,
        )
    if code in _UNREACHABLE:
        # The service answered but cannot serve right now (Kafka down, starting up).
        return CliError(
            f"{where} is unavailable{tag}: {details}. Retry shortly.", ExitCode.UNAVAILABLE
        )
    if code is grpc.StatusCode.NOT_FOUND:
        return CliError(f"not found{tag}: {details}", ExitCode.NOT_FOUND)
    if reason == Reason.NOT_LEADER:
        return CliError(
            f"{where} is a follower and no leader is elected yet{tag}: {details}. Retry shortly.",
            ExitCode.UNAVAILABLE,
        )
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return CliError(
            f"{where} refused the request: {code.name}{tag}: {details}. Give dsctl a token "
            "(DS_TLS__TOKEN_FILE) and the CA (DS_TLS__CA_FILE).",
            ExitCode.ERROR,
        )
    return CliError(f"{where} refused the request: {code.name}{tag}: {details}", ExitCode.ERROR)


def classify_rpc_error(err: grpc.RpcError, where: Endpoint) -> CliError:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    info = error_info(err)
    return classify(code, details or "", info.reason if info is not None else None, where)


class AssignerClient:
    """AdminService calls with a timeout, leader following and error mapping."""

    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout
        self._assigner = LeaderFollower(AssignerTarget((address,)), connection())
        # Who makes a change, for the assigner's audit records (OFFSETS_RESET).
        self._actor = (("ds-actor", actor()),)

    @property
    def endpoint(self) -> Endpoint:
        """The assigner called now (the leader, once a follower named it)."""
        return assigner_endpoint(self._assigner.address)

    def close(self) -> None:
        self._assigner.close()

    def __enter__(self) -> AssignerClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, rpc: Callable[[admin_pb2_grpc.AdminServiceStub], R]) -> R:
        # Followed once: a second NOT_LEADER means leadership is moving; report it.
        try:
            return self._assigner.call(admin_pb2_grpc.AdminServiceStub, rpc, FOLLOW_ONCE)
        except grpc.RpcError as err:
            raise classify_rpc_error(err, self.endpoint) from None

    def list_groups(self) -> list[admin_pb2.GroupSummary]:
        """Every group, all pages, ordered by name."""
        groups: list[admin_pb2.GroupSummary] = []
        token = ""
        while True:
            response = self._call(functools.partial(self._list_page, token))
            groups.extend(response.groups)
            token = response.next_page_token
            if not token:
                return groups

    def _list_page(
        self, token: str, stub: admin_pb2_grpc.AdminServiceStub
    ) -> admin_pb2.ListGroupsResponse:
        request = admin_pb2.ListGroupsRequest(page_size=MAX_PAGE_SIZE, page_token=token)
        return stub.ListGroups(request, timeout=self.timeout)

    def describe(self, group: str) -> admin_pb2.DescribeGroupResponse:
        if not group.strip():
            raise CliError("GROUP must not be empty", ExitCode.ERROR)
        request = admin_pb2.DescribeGroupRequest(group=group)
        return self._call(lambda s: s.DescribeGroup(request, timeout=self.timeout))

    def list_clients(self, group: str | None) -> list[admin_pb2.ClientView]:
        """The clients of GROUP, or of every group when None."""
        if group is not None and not group.strip():
            raise CliError("GROUP must not be empty", ExitCode.ERROR)
        request = admin_pb2.ListClientsRequest(group=group or "")
        return list(self._call(lambda s: s.ListClients(request, timeout=self.timeout)).clients)

    # ---- changes (each request carries a request_id, so a retry is applied once) --------

    def reset_offsets(
        self, request: admin_pb2.ResetOffsetsRequest
    ) -> admin_pb2.ResetOffsetsResponse:
        return self._call(
            lambda s: s.ResetOffsets(request, timeout=self.timeout, metadata=self._actor)
        )

    def create_group(self, request: admin_pb2.CreateGroupRequest) -> admin_pb2.CreateGroupResponse:
        return self._call(
            lambda s: s.CreateGroup(request, timeout=self.timeout, metadata=self._actor)
        )

    def update_group(self, request: admin_pb2.UpdateGroupRequest) -> admin_pb2.UpdateGroupResponse:
        return self._call(
            lambda s: s.UpdateGroup(request, timeout=self.timeout, metadata=self._actor)
        )

    def delete_group(self, request: admin_pb2.DeleteGroupRequest) -> admin_pb2.DeleteGroupResponse:
        return self._call(
            lambda s: s.DeleteGroup(request, timeout=self.timeout, metadata=self._actor)
        )

    def move_lease(self, request: admin_pb2.MoveLeaseRequest) -> admin_pb2.MoveLeaseResponse:
        return self._call(
            lambda s: s.MoveLease(request, timeout=self.timeout, metadata=self._actor)
        )

    def drain(self, request: admin_pb2.DrainSidecarRequest) -> admin_pb2.DrainSidecarResponse:
        return self._call(
            lambda s: s.DrainSidecar(request, timeout=self.timeout, metadata=self._actor)
        )

    def undrain(self, request: admin_pb2.UndrainSidecarRequest) -> admin_pb2.UndrainSidecarResponse:
        return self._call(
            lambda s: s.UndrainSidecar(request, timeout=self.timeout, metadata=self._actor)
        )

    def describe_groups(self, group: str | None) -> list[admin_pb2.DescribeGroupResponse]:
        """DescribeGroup of ``group`` (NOT_FOUND is an error), or of every group the
        assigner manages (a group deleted meanwhile is skipped)."""
        if group is not None:
            return [self.describe(group)]
        described = []
        for summary in self.list_groups():
            try:
                described.append(self.describe(summary.config.name))
            except CliError as err:
                if err.exit_code is not ExitCode.NOT_FOUND:
                    raise
        return described


def actor() -> str:
    """``user@host`` of whoever runs dsctl: the ``ds-actor`` of its changes."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (containers)
        user = "?"
    return f"{user}@{socket.gethostname()}"


@dataclasses.dataclass(frozen=True)
class FaultFilter:
    group: str = ""
    types: tuple[common_pb2.FaultType.ValueType, ...] = ()
    open_only: bool = False


class NotifierClient:
    """NotifierService fault reads with a timeout and error mapping."""

    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.endpoint = notifier_endpoint(address)
        self.timeout = timeout
        self._channel = open_channel(address, connection())
        self._stub = notifier_pb2_grpc.NotifierServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> NotifierClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def list_faults(self, which: FaultFilter, limit: int) -> list[common_pb2.FaultEvent]:
        """The newest ``limit`` stored events matching ``which``, newest first."""
        events: list[common_pb2.FaultEvent] = []
        token = ""
        while len(events) < limit:
            request = notifier_pb2.ListFaultsRequest(
                group=which.group,
                types=which.types,
                open_only=which.open_only,
                page_size=min(MAX_PAGE_SIZE, limit - len(events)),
                page_token=token,
            )
            try:
                response = self._stub.ListFaults(request, timeout=self.timeout)
            except grpc.RpcError as err:
                raise classify_rpc_error(err, self.endpoint) from None
            events.extend(response.faults)
            token = response.next_page_token
            if not token:
                break
        return events[:limit]

    def watch_faults(self, which: FaultFilter) -> Iterator[common_pb2.FaultEvent]:
        """Events published from now on, until the caller stops iterating (or the stream
        ends: then the notifier is going away, reported as unavailable)."""
        request = notifier_pb2.WatchFaultsRequest(group=which.group, types=which.types)
        call = self._stub.WatchFaults(request)
        try:
            for response in call:
                yield response.event
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.CANCELLED:  # our own cancel on exit
                return
            raise classify_rpc_error(err, self.endpoint) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]
        raise CliError(
            f"{self.endpoint} closed the fault stream (shutting down?)", ExitCode.UNAVAILABLE
        )
