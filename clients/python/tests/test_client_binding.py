"""How DsClient keeps its binding (docs/client-protocol.md §3): versions, the empty-binding
grace after a leader change, and the watch's terminal errors. Against a scripted assigner
(clients/python/tests/scripted.py) whose watch pushes what each test says; what the client
did is read from what it calls next (the ``known_version`` of its next watch) and from
:attr:`DsClient.endpoints`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from scripted import (
    Assigner,
    FetchSeen,
    Servers,
    Sidecar,
    binding,
    not_leader,
    wait_for,
)

from dsclient import ClientError, DsClient


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    yield running
    running.close()


def sidecars(servers: Servers, count: int) -> list[str]:
    fetches: list[FetchSeen] = []
    return sorted(servers.sidecar(Sidecar(fetches)) for _ in range(count))


def rewatch(assigner: Assigner) -> int:
    """End the open watch (UNAVAILABLE) and return the known_version of the next one."""
    watches = len(assigner.watches)
    assigner.watch.put(grpc.StatusCode.UNAVAILABLE)
    wait_for(lambda: len(assigner.watches) > watches)
    return assigner.watches[-1]


def test_a_lower_version_is_ignored_and_version_0_is_applied(servers: Servers) -> None:
    """C13 and C55."""
    a, b = sidecars(servers, 2)
    assigner = Assigner(binding(5, a))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        wait_for(lambda: assigner.watches == [5])
        assigner.watch.put(binding(3, a, b))  # lower than the 5 held: ignored
        assert rewatch(assigner) == 5
        assert client.endpoints == [a]
        assigner.watch.put(binding(6, b))  # higher: applied
        assert rewatch(assigner) == 6
        assert client.endpoints == [b]
        assigner.watch.put(binding(0, a))  # 0, a leader's first binding: applied
        assert rewatch(assigner) == 0
        assert client.endpoints == [a]


def test_an_empty_binding_right_after_a_leader_change_is_not_applied_but_its_version_kept(
    servers: Servers,
) -> None:
    """C16: the new leader has not heard from the sidecars yet; the client keeps reading
    the ones it has, watches on with the empty binding's version, and applies the next
    binding that names sidecars."""
    a, b = sidecars(servers, 2)
    new_leader = Assigner(binding(2))  # no endpoints yet
    new_address = servers.assigner(new_leader)
    old_leader = Assigner(binding(4, a, b))
    with DsClient("g", client_id="c", assigner=servers.assigner(old_leader)) as client:
        wait_for(lambda: old_leader.watches == [4])
        old_leader.watch.put(not_leader(new_address))
        wait_for(lambda: new_leader.watches)
        assert client.assigner == new_address and new_leader.binds == 1
        assert new_leader.watches == [2]  # the empty binding's version is held ...
        assert client.endpoints == [a, b]  # ... and its (lack of) sidecars not applied
        new_leader.watch.put(binding(3, a))
        assert rewatch(new_leader) == 3
        assert client.endpoints == [a]


def test_an_empty_binding_without_a_leader_change_is_applied(servers: Servers) -> None:
    """C16's other side: no leader change, no grace."""
    (a,) = sidecars(servers, 1)
    assigner = Assigner(binding(4, a))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        wait_for(lambda: assigner.watches == [4])
        assigner.watch.put(binding(5))
        assert rewatch(assigner) == 5
        assert client.endpoints == []


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    ],
)
@pytest.mark.parametrize("read", ["fetch", "stream"])
def test_a_watch_ended_by_a_terminal_status_stops_and_the_next_read_raises_it(
    servers: Servers, code: grpc.StatusCode, read: str
) -> None:
    """C54 (O10): the group was deleted or the client's role revoked while it reads."""
    (a,) = sidecars(servers, 1)
    assigner = Assigner(binding(1, a))
    with DsClient("g", client_id="c", assigner=servers.assigner(assigner)) as client:
        wait_for(lambda: assigner.watches == [1])
        assigner.watch.put(code)
        started = time.monotonic()
        with pytest.raises(ClientError) as raised:
            if read == "fetch":
                while time.monotonic() - started < 5:
                    client.fetch(10, max_wait=0.1)
            else:
                for _ in client.stream(10, use_stream_rpc=True):
                    pass
        cause = raised.value.__cause__
        assert isinstance(cause, grpc.RpcError) and cause.code() is code
        with pytest.raises(ClientError):  # and every read after it
            client.fetch(10, max_wait=0.1)
        time.sleep(1.0)  # a watch that went on would have been opened again by now
        assert assigner.watches == [1]
