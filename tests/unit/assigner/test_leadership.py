"""Leader election decisions, the leader guard, and leader-key parsing (no Consul needed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st

from dsclient.leader_watch import leader_of, next_index
from dsclient.reasons import LEADER_METADATA_KEY, error_info, trailing_value
from services.assigner.leader_guard import LeaderGuard, _until, is_guarded, not_leader, rejection
from services.assigner.leadership import (
    ElectionSettings,
    LeaderElector,
    StaticLeadership,
    service_check_id,
    term_check_budget,
)
from services.runtime.grpcserver import create_server
from services.runtime.settings import ServiceSettings


class FakeLeadership:
    def __init__(self, is_leader: bool, leader: str | None) -> None:
        self.is_leader = is_leader
        self.leader_address = leader
        self.lost = asyncio.Event()

    def term_lost(self) -> asyncio.Event:
        return self.lost

    async def run(self) -> None:
        return None

    async def resign(self) -> None:
        return None


# ---- leader key -------------------------------------------------------------------------


def test_leader_of_needs_a_session() -> None:
    assert leader_of(None) is None
    assert leader_of({"Value": b"10.0.0.1:7070"}) is None  # released: value stays, no leader
    assert leader_of({"Value": b"10.0.0.1:7070", "Session": "s1"}) == "10.0.0.1:7070"
    assert leader_of({"Value": None, "Session": "s1"}) is None
    assert leader_of({"Value": b" ", "Session": "s1"}) is None


def test_next_index_resets_when_it_goes_backwards() -> None:
    assert next_index(None, "42") == 42
    assert next_index(42, 43) == 43
    assert next_index(42, 7) is None
    assert next_index(42, 0) is None
    assert next_index(None, None) is None


def test_service_check_id_matches_name_and_address() -> None:
    services = {
        "ds-sidecar-a": {"Service": "ds-sidecar", "Address": "127.0.0.1", "Port": 7070},
        "ds-assigner-h-127.0.0.1-7071": {
            "Service": "ds-assigner",
            "Address": "127.0.0.1",
            "Port": 7071,
        },
    }
    assert (
        service_check_id(services, "ds-assigner", "127.0.0.1:7071")
        == "service:ds-assigner-h-127.0.0.1-7071"
    )
    with pytest.raises(LookupError):
        service_check_id(services, "ds-assigner", "127.0.0.1:7070")


# ---- guard decisions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "guarded"),
    [
        ("/dataservice.assigner.v1.AssignerService/Session", True),
        ("/dataservice.assigner.v1.BindingService/Bind", True),
        ("/dataservice.assigner.v1.AdminService/ListGroups", True),
        ("/grpc.health.v1.Health/Check", False),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),
        ("/dataservice.sidecar.v1.StreamService/Fetch", False),
    ],
)
def test_only_assigner_apis_are_guarded(method: str, guarded: bool) -> None:
    assert is_guarded(method) is guarded


def test_rejection_names_the_leader() -> None:
    follower = FakeLeadership(False, "10.0.0.2:7070")
    err = rejection(follower, "/dataservice.assigner.v1.AdminService/ListGroups")
    assert err is not None
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.reason.value == "NOT_LEADER"
    assert err.trailing == {LEADER_METADATA_KEY: "10.0.0.2:7070"}
    assert rejection(follower, "/grpc.health.v1.Health/Check") is None
    assert rejection(FakeLeadership(True, "me:1"), "/dataservice.assigner.v1.X/Y") is None
    assert not_leader(None).trailing == {LEADER_METADATA_KEY: ""}


# ---- the guard on a real in-process server ------------------------------------------------

_ADMIN = "dataservice.assigner.v1.AdminService"
_BINDING = "dataservice.assigner.v1.BindingService"


def _generic_handlers() -> list[grpc.GenericRpcHandler]:
    async def list_groups(request: bytes, context: Any) -> bytes:
        return b"groups"

    async def watch(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.Event().wait()  # a watch stream that never ends by itself
        yield b"never"  # pragma: no cover

    return [
        grpc.method_handlers_generic_handler(
            _ADMIN, {"ListGroups": grpc.unary_unary_rpc_method_handler(list_groups)}
        ),
        grpc.method_handlers_generic_handler(
            _BINDING, {"WatchBinding": grpc.unary_stream_rpc_method_handler(watch)}
        ),
    ]


async def _serve(leadership: FakeLeadership) -> tuple[grpc.aio.Server, str]:
    settings = ServiceSettings(host="127.0.0.1", grpc_port=0)
    server = create_server(settings, [], interceptors=[LeaderGuard(leadership)])
    server.server.add_generic_rpc_handlers(_generic_handlers())
    await server.server.start()
    await server.set_serving(True)
    return server.server, f"127.0.0.1:{server.port}"


def test_follower_rejects_with_leader_and_keeps_health() -> None:
    asyncio.run(_follower_rejects_with_leader_and_keeps_health())


async def _follower_rejects_with_leader_and_keeps_health() -> None:
    leadership = FakeLeadership(False, "10.9.9.9:7070")
    server, address = await _serve(leadership)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            list_groups = channel.unary_unary(f"/{_ADMIN}/ListGroups")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await list_groups(b"", timeout=5)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            info = error_info(caught.value)
            assert info is not None and info.reason == "NOT_LEADER"
            assert trailing_value(caught.value, LEADER_METADATA_KEY) == "10.9.9.9:7070"

            health = health_pb2_grpc.HealthStub(channel)
            response = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING

            leadership.is_leader = True
            assert await list_groups(b"", timeout=5) == b"groups"
    finally:
        await server.stop(0)


def test_demoted_leader_ends_open_streams() -> None:
    asyncio.run(_demoted_leader_ends_open_streams())


async def _demoted_leader_ends_open_streams() -> None:
    leadership = FakeLeadership(True, "127.0.0.1:1")
    server, address = await _serve(leadership)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_stream(f"/{_BINDING}/WatchBinding")(b"", timeout=10)
            assert await call.read() == b"first"
            leadership.is_leader = False
            leadership.leader_address = "10.0.0.3:7070"
            leadership.lost.set()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert trailing_value(caught.value, LEADER_METADATA_KEY) == "10.0.0.3:7070"
    finally:
        await server.stop(0)


# ---- election state machine (a fake Consul client) ----------------------------------------


class _FakeKV:
    def __init__(self) -> None:
        self.puts: list[dict[str, Any]] = []
        self.grant = True

    def put(self, key: str, value: str, **kwargs: Any) -> bool:
        self.puts.append({"key": key, "value": value, **kwargs})
        return self.grant


class _FakeSession:
    def __init__(self) -> None:
        self.alive = True

    def info(self, session: str) -> tuple[int, dict[str, Any] | None]:
        return 1, ({"ID": session} if self.alive else None)


class _FakeConsul:
    def __init__(self) -> None:
        self.kv = _FakeKV()
        self.session = _FakeSession()


def test_elector_transitions() -> None:
    asyncio.run(_elector_transitions())


async def _elector_transitions() -> None:
    events: list[str] = []

    async def elected() -> None:
        events.append("elected")

    async def demoted() -> None:
        events.append("demoted")

    fake = _FakeConsul()
    elector = LeaderElector(
        ElectionSettings(consul="127.0.0.1:8500", address="127.0.0.1:7001"),
        on_elected=elected,
        on_demoted=demoted,
        client=fake,  # type: ignore[arg-type]
    )
    elector.session_id = "mine"

    # No holder: acquire with our session and our address.
    assert await elector._on_key({"Value": b"old:1"}) is True
    assert fake.kv.puts[-1] == {
        "key": "dataservice/assigner/leader",
        "value": "127.0.0.1:7001",
        "acquire": "mine",
    }
    assert not elector.is_leader

    # The key now names our session: elected, once.
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    assert elector.is_leader and elector.leader_address == "127.0.0.1:7001"
    term = elector.term_lost()
    assert not term.is_set()

    # Another session holds it: demoted at once, following the other replica.
    await elector._on_key({"Value": b"127.0.0.1:7002", "Session": "theirs"})
    assert not elector.is_leader and term.is_set()
    assert elector.leader_address == "127.0.0.1:7002"
    assert events == ["elected", "demoted"]

    # A lost race with an invalidated session: the session is dropped (re-created next).
    fake.kv.grant = False
    fake.session.alive = False
    await elector._on_key(None)
    assert elector.session_id is None


def test_elected_replica_that_cannot_take_office_releases_the_lock() -> None:
    asyncio.run(_cannot_take_office())


async def _cannot_take_office() -> None:
    """on_elected failing (the state topic did not serve in time) must not leave a replica
    holding the lock without serving: it demotes itself and releases the key, so a standby
    (or itself, on the next campaign round) takes office."""
    events: list[str] = []
    attempts = 0

    async def elected() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise TimeoutError("state topic not serving")
        events.append("elected")

    async def demoted() -> None:
        events.append("demoted")

    fake = _FakeConsul()
    elector = LeaderElector(
        ElectionSettings(consul="127.0.0.1:8500", address="127.0.0.1:7001", step_aside_seconds=0),
        on_elected=elected,
        on_demoted=demoted,
        client=fake,  # type: ignore[arg-type]
    )
    elector.session_id = "mine"
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    assert not elector.is_leader and elector.term_lost().is_set()
    assert fake.kv.puts[-1] == {
        "key": "dataservice/assigner/leader",
        "value": "127.0.0.1:7001",
        "release": "mine",
    }
    assert events == ["demoted"]
    # The next round finds the key held by its session again: it takes office this time.
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    assert elector.is_leader and events == ["demoted", "elected"]


def test_static_leadership_always_leads() -> None:
    asyncio.run(_static_leadership_always_leads())


async def _static_leadership_always_leads() -> None:
    called: list[bool] = []

    async def elected() -> None:
        called.append(True)

    static = StaticLeadership("127.0.0.1:7070", on_elected=elected)
    await static.run()
    assert static.is_leader and static.leader_address == "127.0.0.1:7070"
    assert not static.term_lost().is_set()
    assert called == [True]


def test_a_leader_that_cannot_reach_consul_leads_on_while_its_term_is_confirmed() -> None:
    asyncio.run(_term_confirmed_through_the_state_topic())


async def _term_confirmed_through_the_state_topic() -> None:
    """Consul unreachable past ``stale_after_seconds``: the leader does not resign while
    the state topic confirms its term; the first confirmation that fails (fenced by a
    newer leader's term) demotes it at once. Without ``confirm_term`` it resigns."""
    events: list[str] = []
    fenced = False

    async def confirm() -> None:
        events.append("confirmed")
        if fenced:
            raise RuntimeError("Fenced")

    async def demoted() -> None:
        events.append("demoted")

    settings = ElectionSettings(
        consul="127.0.0.1:8500",
        address="127.0.0.1:7001",
        stale_after_seconds=0.05,
        term_check_seconds=0.01,
    )
    elector = LeaderElector(
        settings,
        on_demoted=demoted,
        confirm_term=confirm,
        client=_FakeConsul(),  # type: ignore[arg-type]
    )
    elector.session_id = "mine"
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    assert elector.is_leader
    checks = asyncio.create_task(elector._term_loop())
    try:
        await asyncio.sleep(0.3)  # no Consul confirmation since the election
        assert elector.is_leader, "leads on while the term is confirmed"
        assert events.count("confirmed") >= 3 and "demoted" not in events
        fenced = True
        await asyncio.sleep(0.1)
        assert not elector.is_leader and elector.term_lost().is_set()
        assert events[-1] == "demoted"
    finally:
        checks.cancel()

    plain = LeaderElector(settings, client=_FakeConsul())  # type: ignore[arg-type]
    plain.session_id = "mine"
    await plain._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    checks = asyncio.create_task(plain._term_loop())
    try:
        await asyncio.sleep(0.2)
        assert not plain.is_leader, "without confirm_term a stale leader resigns"
    finally:
        checks.cancel()


def test_one_slow_term_check_write_does_not_end_the_term() -> None:
    asyncio.run(_slow_term_check())


async def _slow_term_check() -> None:
    """Consul unreachable, and one term-check write times out (a slow broker: it proves
    neither that the term goes on nor that it ended). The check retries it within its
    budget and the leader leads on; only a refusal (fenced), or writes that time out for the
    whole budget, end the term. Chaos scenario 3 on three brokers lost its leader this way:
    'Consul unreachable and the term not confirmed: TimeoutError(... not committed within
    2s)', then nobody could be elected and every lease lapsed."""
    outcomes: list[BaseException | None] = [TimeoutError("not committed within 2s")]
    events: list[str] = []
    always_slow = False

    async def confirm() -> None:
        outcome = outcomes.pop(0) if outcomes else None
        if always_slow:
            outcome = TimeoutError("not committed within 2s")
        events.append("timeout" if isinstance(outcome, TimeoutError) else "confirmed")
        if outcome is not None:
            raise outcome

    async def demoted() -> None:
        events.append("demoted")

    settings = ElectionSettings(
        consul="127.0.0.1:8500",
        address="127.0.0.1:7001",
        stale_after_seconds=0.05,
        term_check_seconds=0.01,
        term_check_budget_seconds=0.5,
    )
    elector = LeaderElector(
        settings,
        on_demoted=demoted,
        confirm_term=confirm,
        client=_FakeConsul(),  # type: ignore[arg-type]
    )
    elector.session_id = "mine"
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    checks = asyncio.create_task(elector._term_loop())
    try:
        await asyncio.sleep(0.2)
        assert elector.is_leader, f"one slow write ended the term: {events}"
        assert events[0] == "timeout" and "confirmed" in events and "demoted" not in events
        # Writes that only ever time out, for the whole budget: the term ends.
        always_slow = True
        for _ in range(500):  # the term ends about 0.5 s from now; up to 5 s on a slow box
            if not elector.is_leader:
                break
            await asyncio.sleep(0.01)
        assert not elector.is_leader and events[-1] == "demoted"
        # Retries pause between attempts (term_check_seconds): no busy loop on a write
        # that fails at once.
        assert events.count("timeout") < 0.5 / 0.01 + 10, events.count("timeout")
    finally:
        checks.cancel()


def test_static_leadership_stops_for_good_when_fenced() -> None:
    async def main() -> None:
        demoted: list[bool] = []

        async def on_demoted() -> None:
            demoted.append(True)

        static = StaticLeadership("127.0.0.1:7070", on_demoted=on_demoted)
        await static.run()
        await static.fenced()
        await static.fenced()
        assert not static.is_leader and static.leader_address is None
        assert static.term_lost().is_set()
        assert demoted == [True]

    asyncio.run(main())


def test_a_leader_whose_session_was_invalidated_retakes_the_free_lock_without_stepping_down() -> (
    None
):
    asyncio.run(_retakes_the_free_lock())


async def _retakes_the_free_lock() -> None:
    """After a Consul outage longer than the session TTL, Consul invalidates the leader's
    session and frees the key. A leader whose term is fenced by the state topic keeps
    leading and takes the key back (no leaderless gap, no lease lapsing); it steps down
    only once another replica holds the key. Without fenced writes it steps down at once,
    as before."""
    events: list[str] = []

    async def confirm() -> None:
        return None

    async def demoted() -> None:
        events.append("demoted")

    fake = _FakeConsul()
    fake.session.create = lambda **_kw: "new"  # type: ignore[attr-defined]
    elector = LeaderElector(
        ElectionSettings(consul="127.0.0.1:8500", address="127.0.0.1:7001", checks=("serfHealth",)),
        on_demoted=demoted,
        confirm_term=confirm,
        client=fake,  # type: ignore[arg-type]
    )
    elector.session_id = "mine"
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    assert elector.is_leader
    elector.session_id = None  # Consul invalidated it
    assert await elector._on_key({"Value": b"127.0.0.1:7001"}) is True  # free
    assert elector.is_leader and events == []
    assert elector.leader_address == "127.0.0.1:7001"
    assert fake.kv.puts[-1] == {
        "key": "dataservice/assigner/leader",
        "value": "127.0.0.1:7001",
        "acquire": "new",
    }
    await elector._on_key({"Value": b"127.0.0.1:7001", "Session": "new"})
    assert elector.is_leader and events == []
    # Another replica took it: step down.
    await elector._on_key({"Value": b"127.0.0.1:7002", "Session": "theirs"})
    assert not elector.is_leader and events == ["demoted"]

    plain = LeaderElector(
        ElectionSettings(consul="127.0.0.1:8500", address="127.0.0.1:7001", checks=("serfHealth",)),
        client=_FakeConsul(),  # type: ignore[arg-type]
    )
    plain.session_id = "mine"
    await plain._on_key({"Value": b"127.0.0.1:7001", "Session": "mine"})
    plain.session_id = None
    plain._client.session.create = lambda **_kw: "new"  # type: ignore[attr-defined]
    await plain._on_key({"Value": b"127.0.0.1:7001"})
    assert not plain.is_leader, "without fenced writes a free key means stepping down"


def test_a_standby_back_from_a_consul_outage_leaves_the_free_key_to_the_leader_for_a_while() -> (
    None
):
    asyncio.run(_standby_defers_after_an_outage())


async def _standby_defers_after_an_outage() -> None:
    """Chaos scenario 3: Consul, back after an outage, invalidated the leader's session and
    freed the key; the standby (a session ready, one write to acquire) took it before the
    leader that had led through the outage, and the new leader's restore let every lease
    lapse. A standby that saw the outage itself now leaves a free key alone for
    ``rejoin_defer_seconds``; one that did not (a plain failover) takes it at once."""
    settings = ElectionSettings(
        consul="127.0.0.1:8500",
        address="127.0.0.1:7002",
        checks=("serfHealth",),
        rejoin_defer_seconds=0.4,
        wait_seconds=5,
        consul_stall_seconds=3.0,
    )
    plain = LeaderElector(settings, client=_FakeConsul())  # type: ignore[arg-type]
    plain.session_id = "standby"
    plain._consul_answer(time.monotonic())
    assert await plain._on_key({"Value": b"127.0.0.1:7001"}) is True
    assert plain._client.kv.puts[-1]["acquire"] == "standby", "no outage: no deferral"

    for outage in ("a failed call", "a stalled blocking query"):
        fake = _FakeConsul()
        standby = LeaderElector(settings, client=fake)  # type: ignore[arg-type]
        standby.session_id = "standby"
        standby._consul_answer(time.monotonic())  # it was following the leader
        if outage == "a failed call":
            await standby._on_consul_error(ConnectionError("connection refused"))
            standby._consul_answer(time.monotonic())
        else:
            standby._consul_answer(time.monotonic() - 20)  # asked 20 s ago, wait 5 s
        started = time.monotonic()
        assert await standby._on_key({"Value": b"127.0.0.1:7001"}) is True
        assert time.monotonic() - started >= 0.35, outage
        assert fake.kv.puts == [], f"{outage}: the free key was taken during the deferral"
        # Deferral over: the next look at a still free key acquires it.
        await standby._on_key({"Value": b"127.0.0.1:7001"})
        assert fake.kv.puts[-1]["acquire"] == "standby", outage

    # Start-up errors (not registered, check not passing yet) are no outage.
    fresh = LeaderElector(settings, client=_FakeConsul())  # type: ignore[arg-type]
    fresh.session_id = "standby"
    fresh._consul_answer(time.monotonic())
    await fresh._on_consul_error(LookupError("ds-assigner is not registered yet"))
    fresh._consul_answer(time.monotonic())
    assert fresh._deferring() == 0.0


@given(
    ttl=st.floats(min_value=0.5, max_value=300),
    grace=st.floats(min_value=0.1, max_value=60),
    check=st.floats(min_value=0.05, max_value=0.5),
)
def test_a_cut_off_leader_resigns_before_a_successor_grants(
    ttl: float, grace: float, check: float
) -> None:
    """A check starts up to ``check`` late and retries for the budget: the leader is gone
    by TTL + grace, when a successor may grant (the assigner's lease limits allow this
    TTL and grace; the defaults give the 3.5 s the module doc names)."""
    budget = term_check_budget(ttl, grace, check)
    assert budget >= 0
    assert check + budget <= ttl + grace + 1e-9
    assert term_check_budget(3.0, 1.0, ElectionSettings.term_check_seconds) == 3.5


# ---- _until: one waiter per stream, the stream's own awaits cancelled on a lost term ---------


class _Recorded:
    """A stream that yields what it is fed and records how it ended."""

    def __init__(self) -> None:
        self.feed: asyncio.Queue[int] = asyncio.Queue()
        self.asked = 0
        self.ended: str | None = None

    async def stream(self) -> AsyncIterator[int]:
        try:
            while True:
                self.asked += 1
                yield await self.feed.get()
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        finally:
            self.ended = self.ended or "closed"


def test_until_cancels_the_streams_await_when_the_term_ends_and_leaves_the_caller_uncancelled() -> (
    None
):
    async def run() -> None:
        stop, rec = asyncio.Event(), _Recorded()
        rec.feed.put_nowait(1)
        got = []

        async def consume() -> None:
            async for item in _until(rec.stream(), stop):
                got.append(item)
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0  # the guard goes on to abort

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.01)  # the stream now waits for its second item
        stop.set()
        await asyncio.wait_for(consumer, 5)
        assert got == [1] and rec.ended == "cancelled"

    asyncio.run(run())


def test_until_asks_for_no_more_items_once_the_term_ended_while_one_was_out() -> None:
    async def run() -> None:
        stop, rec = asyncio.Event(), _Recorded()
        rec.feed.put_nowait(1)
        rec.feed.put_nowait(2)
        got = []
        async for item in _until(rec.stream(), stop):
            got.append(item)
            stop.set()  # while the item is with the caller (gRPC sending it)
            await asyncio.sleep(0)
        assert got == [1] and rec.asked == 1 and rec.ended == "closed"

    asyncio.run(run())


def test_until_passes_the_calls_own_cancellation_through() -> None:
    async def run() -> None:
        stop, rec = asyncio.Event(), _Recorded()

        async def consume() -> None:
            async for _ in _until(rec.stream(), stop):
                pass  # pragma: no cover

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.01)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert rec.ended == "cancelled" and not stop.is_set()

    asyncio.run(run())


def test_until_ends_with_the_stream() -> None:
    async def run() -> None:
        async def three() -> AsyncIterator[int]:
            for i in range(3):
                yield i

        assert [i async for i in _until(three(), asyncio.Event())] == [0, 1, 2]

    asyncio.run(run())
