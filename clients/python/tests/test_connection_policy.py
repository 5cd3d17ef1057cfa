"""The connection module's pure parts: what a failure means, the backoff schedule, a call's
budget, the channel options and service config, replica rotation."""

from __future__ import annotations

import json

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsclient.connection.policy import (
    FOLLOW_ONCE,
    Action,
    Attempts,
    Backoff,
    CallPolicy,
    Failure,
    decide,
    pause_before_retry,
)
from dsclient.connection.settings import (
    ConnectionSettings,
    GrpcRetryPolicy,
    channel_options,
    service_config,
)
from dsclient.connection.targets import AssignerTarget, LeaderUnknown
from dsclient.reasons import Reason

NOT_LEADER = Reason.NOT_LEADER.value
FAILED = grpc.StatusCode.FAILED_PRECONDITION
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
DEFAULT = CallPolicy()


@pytest.mark.parametrize(
    ("failure", "policy", "action"),
    [
        # A follower names the leader: follow it at once, whatever the budget's rules.
        (Failure(FAILED, NOT_LEADER, "b:1"), DEFAULT, Action.FOLLOW),
        (Failure(FAILED, NOT_LEADER, "b:1"), FOLLOW_ONCE, Action.FOLLOW),
        # NOT_LEADER without a leader: an election in progress.
        (Failure(FAILED, NOT_LEADER, None), DEFAULT, Action.RETRY),
        (Failure(FAILED, NOT_LEADER, None), FOLLOW_ONCE, Action.RAISE),
        # A "leader" that is the replica just called is no redirect.
        (Failure(FAILED, NOT_LEADER, "a:1"), DEFAULT, Action.RETRY),
        (Failure(UNAVAILABLE), DEFAULT, Action.RETRY),
        (Failure(UNAVAILABLE, Reason.KAFKA_UNAVAILABLE.value), DEFAULT, Action.RETRY),
        (Failure(UNAVAILABLE), FOLLOW_ONCE, Action.RAISE),
        (Failure(grpc.StatusCode.DEADLINE_EXCEEDED), DEFAULT, Action.RAISE),
        (Failure(grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD.value), DEFAULT,
         Action.RAISE),
        (Failure(FAILED, Reason.LEASE_NOT_HELD.value), DEFAULT, Action.RAISE),
        (
            Failure(grpc.StatusCode.DEADLINE_EXCEEDED),
            CallPolicy(retry_codes=frozenset(grpc.StatusCode)),
            Action.RETRY,
        ),
    ],
)  # fmt: skip
def test_decide(failure: Failure, policy: CallPolicy, action: Action) -> None:
    assert decide(failure, "a:1", policy) is action


backoffs = st.builds(
    lambda initial, factor, multiplier: Backoff(initial, initial * factor, multiplier),
    st.floats(0.001, 5.0),
    st.floats(1.0, 100.0),
    st.floats(1.0, 10.0),
)


@given(backoffs, st.integers(0, 10_000), st.floats(0.0, 0.999_999))
def test_backoff_grows_to_its_maximum_and_jitters_by_half(
    backoff: Backoff, retry: int, draw: float
) -> None:
    base = backoff.base(retry)
    assert backoff.initial <= base <= backoff.maximum
    assert backoff.base(retry + 1) >= base
    assert 0.5 * base <= backoff.delay(retry, draw) < 1.5 * base


@given(backoffs, st.integers(0, 10_000), st.floats(0.0, 0.999_999), st.floats(0.0, 600.0))
def test_a_retry_after_is_waited_at_least_and_jittered_by_up_to_half(
    backoff: Backoff, retry: int, draw: float, retry_after: float
) -> None:
    """A throttled join (JOIN_THROTTLED, issue 36) waits at least what the server asked,
    spread over another half of it, and never less than the backoff."""
    pause = pause_before_retry(backoff, retry, draw, retry_after)
    assert pause >= retry_after
    assert pause >= backoff.delay(retry, draw)
    assert pause <= max(backoff.delay(retry, draw), 1.5 * retry_after)
    assert pause_before_retry(backoff, retry, draw) == backoff.delay(retry, draw)


def test_backoff_doubles_from_initial() -> None:
    backoff = Backoff(0.05, 2.0)
    assert [backoff.base(n) for n in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


steps = st.lists(
    st.tuples(st.sampled_from(list(Action)), st.floats(0.0, 3.0), st.floats(0.0, 0.999)),
    max_size=40,
)


@given(st.integers(1, 10), steps)
def test_attempts_never_exceed_the_budget(
    limit: int, actions: list[tuple[Action, float, float]]
) -> None:
    attempts = Attempts(CallPolicy(attempts=limit), started=0.0)
    now, granted = 0.0, 0
    for action, elapsed, draw in actions:
        now += elapsed
        pause = attempts.pause(action, now, draw)
        if pause is None:
            break
        granted += 1
        assert action is not Action.RAISE
        assert (pause == 0.0) == (action is Action.FOLLOW)
    assert granted <= limit - 1  # every granted pause is followed by one more attempt


@given(st.floats(0.1, 30.0), steps)
def test_no_attempt_starts_past_the_deadline(
    deadline: float, actions: list[tuple[Action, float, float]]
) -> None:
    policy = CallPolicy(attempts=None, deadline=deadline)
    attempts = Attempts(policy, started=100.0)
    now = 100.0
    for action, elapsed, draw in actions:
        now += elapsed
        retries = attempts.retries
        pause = attempts.pause(action, now, draw)
        if pause is None:
            # Given up only when told to, or when the next attempt would start too late.
            if action is not Action.RAISE:
                wanted = policy.backoff.delay(retries, draw) if action is Action.RETRY else 0.0
                assert now + wanted > 100.0 + deadline
            return
        assert now + pause <= 100.0 + deadline


def test_follows_do_not_grow_the_backoff() -> None:
    policy = CallPolicy(backoff=Backoff(1.0, 8.0))
    attempts = Attempts(policy, started=0.0)
    assert attempts.pause(Action.FOLLOW, 0.0, 0.5) == 0.0
    assert attempts.pause(Action.RETRY, 0.0, 0.5) == 1.0
    assert attempts.pause(Action.FOLLOW, 0.0, 0.5) == 0.0
    assert attempts.pause(Action.RETRY, 0.0, 0.5) == 2.0


def test_follow_once_follows_one_redirect_and_no_more() -> None:
    attempts = Attempts(FOLLOW_ONCE, started=0.0)
    assert attempts.pause(Action.FOLLOW, 0.0, 0.5) == 0.0
    assert attempts.pause(Action.FOLLOW, 0.0, 0.5) is None


def test_the_service_config_retries_unavailable_only() -> None:
    options = dict(channel_options(ConnectionSettings()))
    assert options["grpc.enable_retries"] == 1
    config = json.loads(options["grpc.service_config"])
    (method,) = config["methodConfig"]
    assert method["name"] == [{}]  # every method of every service
    policy = method["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert 2 <= policy["maxAttempts"] <= 5
    assert options["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert options["grpc.keepalive_time_ms"] == 20_000


def test_no_retry_policy_turns_grpc_retries_off() -> None:
    settings = ConnectionSettings(retry=None)
    assert service_config(settings) is None
    options = dict(channel_options(settings))
    assert options["grpc.enable_retries"] == 0 and "grpc.service_config" not in options


def test_grpc_caps_retry_attempts_at_five() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        GrpcRetryPolicy(max_attempts=6)


def test_replicas_rotate_and_a_lone_address_stays() -> None:
    target = AssignerTarget(("a:1", "b:1", "c:1"))
    assert [target.after(a) for a in ("a:1", "b:1", "c:1", "leader:1")] == [
        "b:1",
        "c:1",
        "a:1",
        "a:1",
    ]
    assert AssignerTarget(("a:1",)).after("a:1") is None
    with pytest.raises(LeaderUnknown):
        AssignerTarget(())
