"""Watch who holds which partition, through the assigner's ``AdminService.DescribeGroup``.

``describe`` takes one snapshot; ``wait_stable`` waits for a balanced, fully granted,
unchanging assignment over an expected set of sidecars; ``AssignmentWatcher`` polls in the
background and keeps each partition's history of (holder, epoch), so a test can tell how
many partitions moved, where from, where to, and when. ``respawn`` starts a stopped or
killed service again with the same arguments and ports (a pod restarted in place).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import grpc

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from tests.support.mesh import Mesh, ServiceProcess

GRANTED = types_pb2.LEASE_STATE_GRANTED


@dataclass(frozen=True)
class LeaseView:
    holder: str
    epoch: int
    state: int

    @property
    def granted(self) -> bool:
        return self.state == GRANTED and bool(self.holder)


Assignment = dict[int, LeaseView]


@dataclass(frozen=True)
class GroupView:
    leases: Assignment
    members: dict[str, str]  # sidecar id -> endpoint


def describe(assigner: str, group: str, timeout: float = 2.0) -> GroupView:
    with grpc.insecure_channel(assigner) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        response = stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=timeout)
    return GroupView(
        leases={
            lease.partition: LeaseView(lease.holder, lease.epoch, lease.state)
            for lease in response.leases
        },
        members={m.sidecar_id: m.endpoint for m in response.members},
    )


def describe_retrying(assigner: str, group: str, seconds: float = 10.0) -> GroupView:
    """:func:`describe`, retrying UNAVAILABLE for up to ``seconds``: the assigner's answer
    when Kafka is slow to give the group's committed offsets ("Kafka did not answer for the
    offsets of group ... in time"), retriable by contract. For a test's one look at a group
    after a scenario (a loaded CI machine failed the zombie test on it, 2 Dec); a test
    that waits for the assigner itself to be unreachable uses :func:`describe`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return describe(assigner, group)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def holders(assignment: Assignment) -> dict[int, str]:
    return {p: v.holder for p, v in assignment.items()}


def counts(assignment: Assignment) -> Counter[str]:
    return Counter(v.holder for v in assignment.values() if v.holder)


def moved(before: Assignment, after: Assignment) -> dict[int, tuple[str, str]]:
    """Partitions whose holder changed: partition -> (old holder, new holder)."""
    return {
        p: (before[p].holder, view.holder)
        for p, view in after.items()
        if p in before and before[p].holder != view.holder
    }


def is_settled(view: GroupView, sidecars: Collection[str], partitions: int) -> bool:
    leases = view.leases
    if len(leases) != partitions or not all(v.granted for v in leases.values()):
        return False
    per = counts(leases)
    if set(per) != set(sidecars) or set(view.members) != set(sidecars):
        return False
    return max(per.values()) - min(per.values()) <= 1


def wait_stable(
    assigner: str,
    group: str,
    sidecars: Collection[str],
    partitions: int,
    *,
    settle: float = 1.5,
    timeout: float = 60.0,
) -> Assignment:
    """A balanced assignment, all GRANTED to exactly ``sidecars``, unchanged for ``settle`` s."""
    deadline = time.monotonic() + timeout
    last: Assignment | None = None
    since = time.monotonic()
    view: GroupView | None = None
    while time.monotonic() < deadline:
        try:
            view = describe(assigner, group)
        except grpc.RpcError:
            time.sleep(0.1)
            continue
        if is_settled(view, sidecars, partitions):
            if view.leases != last:
                last, since = view.leases, time.monotonic()
            elif time.monotonic() - since >= settle:
                return last
        else:
            last = None
        time.sleep(0.1)
    raise TimeoutError(
        f"assignment of {group} over {sorted(sidecars)} not stable within {timeout}s; "
        f"last: {None if view is None else dict(counts(view.leases))} "
        f"members {None if view is None else sorted(view.members)}"
    )


def wait_until(
    assigner: str, group: str, predicate: Callable[[GroupView], bool], timeout: float
) -> tuple[float, GroupView]:
    """Poll DescribeGroup until ``predicate``; returns (monotonic time it held, the view)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            view = describe(assigner, group, timeout=1.0)
            if predicate(view):
                return time.monotonic(), view
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition on {group} not met within {timeout}s")
        time.sleep(0.02)


@dataclass
class AssignmentWatcher:
    """Polls DescribeGroup every ``interval`` s; keeps each partition's (holder, epoch)
    history with the time it was first seen. Unreachable assigner polls are skipped."""

    assigner: str
    group: str
    interval: float = 0.05
    history: dict[int, list[tuple[float, LeaseView]]] = field(default_factory=dict)
    polls: int = 0
    failed_polls: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="assignment-watch", daemon=True)

    def start(self) -> AssignmentWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                view = describe(self.assigner, self.group, timeout=1.0)
            except grpc.RpcError:
                self.failed_polls += 1
                self._stop.wait(self.interval)
                continue
            now = time.monotonic()
            with self._lock:
                self.polls += 1
                for p, lease in view.leases.items():
                    seq = self.history.setdefault(p, [])
                    if not seq or seq[-1][1] != lease:
                        seq.append((now, lease))
            self._stop.wait(self.interval)

    def first_seen(self, partition: int, holder: str, since: float = 0.0) -> float | None:
        """When ``partition`` was first seen GRANTED to ``holder`` at or after ``since``."""
        with self._lock:
            entries = list(self.history.get(partition, []))
        for t, lease in entries:
            if t >= since and lease.holder == holder and lease.granted:
                return t
        return None

    def holder_sequence(self, partition: int, since: float = 0.0) -> list[str]:
        """Distinct consecutive non-empty holders of ``partition`` seen since ``since``
        (including the holder in effect at ``since``)."""
        with self._lock:
            entries = list(self.history.get(partition, []))
        start = 0
        for i, (t, _) in enumerate(entries):
            if t <= since:
                start = i
        out: list[str] = []
        for _, lease in entries[start:]:
            if lease.holder and (not out or out[-1] != lease.holder):
                out.append(lease.holder)
        return out


def respawn(mesh: Mesh, svc: ServiceProcess) -> ServiceProcess:
    """Start ``svc`` again (same kind, arguments, ports, log) after it stopped or was
    killed; the mesh stops the new process at the end of the test."""
    assert svc.proc is not None and svc.proc.poll() is not None, "stop or kill it first"
    again = ServiceProcess(svc.kind, list(svc.args), svc.log, svc.grpc_port, svc.http_port)
    again.env = dict(svc.env)
    mesh.services.append(again)
    return again.start()
