"""What to do after a failed call to the assigner, and how long to wait (pure, no I/O).

A follower assigner answers ``FAILED_PRECONDITION`` / ``NOT_LEADER`` with the leader's
address in trailing metadata ``ds-leader`` (ARCHITECTURE §3 "Leaders"); one that does not
know the leader yet (an election in progress) answers the same without it. So after a
failure the caller does one of three things (:func:`decide`):

* **follow** a leader named by the answer: call it at once, without backing off;
* **retry** an election in progress, or a status the caller's :class:`CallPolicy` counts
  as transient (``UNAVAILABLE`` by default, AIP-194): back off, look the leader up again,
  call again;
* **raise** anything else, unchanged: each caller maps statuses to its own errors.

:class:`Attempts` holds one call to its policy's budget (attempts, a deadline) and gives
the pause before the next attempt; :class:`Backoff` is the jittered exponential schedule.
The clock and the random draw are parameters, so every rule here is tested as a function.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import grpc

from dsclient.reasons import LEADER_METADATA_KEY, Reason, error_info, trailing_value

UNAVAILABLE_ONLY = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: the n-th pause (n from 0) is
    ``min(initial · multiplier^n, maximum)`` times a factor drawn from [0.5, 1.5), so
    callers that failed together do not come back together."""

    initial: float = 0.05
    maximum: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum or self.multiplier < 1:
            raise ValueError("backoff needs 0 < initial ≤ maximum and multiplier ≥ 1")

    def base(self, retry: int) -> float:
        """The un-jittered n-th pause (never above ``maximum``, never overflowing)."""
        delay = self.initial
        for _ in range(retry):
            if delay >= self.maximum:
                break
            delay *= self.multiplier
        return min(delay, self.maximum)

    def delay(self, retry: int, draw: float) -> float:
        """The n-th pause for a uniform ``draw`` from [0, 1)."""
        return self.base(retry) * (0.5 + draw)


def pause_before_retry(
    backoff: Backoff, retry: int, draw: float, retry_after: float | None = None
) -> float:
    """The pause before the next attempt after ``retry`` backoffs, for a uniform ``draw``
    from [0, 1): the jittered backoff, or when the server named a retry-after (a throttled
    join, JOIN_THROTTLED's ``retry_after_ms``) at least that, plus up to half of it again,
    so callers refused together do not come back together (issue 36)."""
    pause = backoff.delay(retry, draw)
    if retry_after is None:
        return pause
    return max(pause, retry_after * (1 + draw / 2))


@dataclass(frozen=True)
class CallPolicy:
    """How long one call may keep trying, and what counts as worth another try."""

    # Attempts in all, a followed redirect included; None: no limit.
    attempts: int | None = 8
    # Seconds from the first attempt after which no new attempt starts; None: no limit.
    deadline: float | None = None
    # Statuses retried after a backoff (gRPC's own retries of UNAVAILABLE come first).
    retry_codes: frozenset[grpc.StatusCode] = UNAVAILABLE_ONLY
    # NOT_LEADER without a leader named: an election in progress; retried if True.
    retry_electing: bool = True
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("a call needs at least one attempt")


# Follow a redirect once and retry nothing: a second NOT_LEADER means leadership is moving,
# and the caller reports it (dsctl's documented exit codes) or tries again later itself.
FOLLOW_ONCE = CallPolicy(attempts=2, retry_codes=frozenset(), retry_electing=False)


class Action(enum.Enum):
    FOLLOW = "follow"  # call the named leader (or the replaced channel's successor) at once
    RETRY = "retry"  # back off, look the leader up again, call again
    RAISE = "raise"  # the caller's to handle


@dataclass(frozen=True)
class Failure:
    """What a failed call said: its status, its ErrorInfo reason, the leader it named."""

    code: grpc.StatusCode
    reason: str | None = None
    leader: str | None = None

    @classmethod
    def of(cls, err: grpc.RpcError) -> Failure:
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        info = error_info(err)
        leader = trailing_value(err, LEADER_METADATA_KEY) or None
        return cls(code, info.reason if info is not None else None, leader)


def decide(failure: Failure, current: str, policy: CallPolicy) -> Action:
    """What to do after ``failure`` answered a call to ``current``."""
    if failure.leader and failure.leader != current:
        return Action.FOLLOW
    if failure.reason == Reason.NOT_LEADER.value:
        return Action.RETRY if policy.retry_electing else Action.RAISE
    return Action.RETRY if failure.code in policy.retry_codes else Action.RAISE


@dataclass
class Attempts:
    """One call's progress through its policy's budget."""

    policy: CallPolicy
    started: float
    made: int = 0  # attempts that failed so far
    retries: int = 0  # backoffs so far (a followed redirect is not one)

    def pause(self, action: Action, now: float, draw: float) -> float | None:
        """After a failed attempt that ``action`` answers: the seconds to wait before the
        next one (0: at once), or None when the call gives up (``RAISE``, no attempts
        left, or the pause would end past the deadline)."""
        self.made += 1
        if action is Action.RAISE:
            return None
        if self.policy.attempts is not None and self.made >= self.policy.attempts:
            return None
        pause = 0.0
        if action is Action.RETRY:
            pause = self.policy.backoff.delay(self.retries, draw)
        deadline = self.policy.deadline
        if deadline is not None and now + pause > self.started + deadline:
            return None
        if action is Action.RETRY:
            self.retries += 1
        return pause
