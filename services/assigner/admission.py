"""Admission of Session joins under overload (issue 36 item 3; pure, the clock a parameter).

A join costs the assigner far more than a heartbeat (a stream set up, a member added, a
rebalance of its group, grants sent), and a reconnect storm brings every sidecar's join at
once. Heartbeats of attached sidecars are never admitted or refused here: they renew
leases, and a sidecar whose heartbeats go unanswered loses its leases (``lease`` mode) or
its failure detection (``kafka`` mode). So only joins are rationed, and what they may use
is bounded: a token bucket of ``burst`` joins refilled at ``rate`` per second.

Guarantees (each held by a Hypothesis property in ``tests/unit/assigner/test_admission.py``):

1. **Bounded work**: over any span of ``t`` seconds, at most ``burst + rate·t`` new joins
   are admitted, however many arrive.
2. **No refusal under capacity**: joins arriving at most ``rate`` per second (from a full
   bucket) are all admitted.
3. **Re-attaches pass**: a join that reports leases it holds (a sidecar whose stream broke,
   or every sidecar after an assigner failover) is always admitted, and pays its token
   (the bucket may go into debt, at most ``burst``): refusing it would cost an attached
   sidecar its leases, which is what the policy exists to prevent.
4. **Spread retries**: a refused join is told when to come back (``retry_after``, at most
   ``max_retry_after``); refusals given together are handed successive slots ``1/rate``
   apart, so the storm comes back at the rate the bucket refills rather than all at once
   (the client adds its jitter on top: dsclient.connection.policy).
5. **Heartbeats first**: while the assigner's event loop runs late by more than
   ``max_lag`` (its heartbeats are being answered late), every new join is refused
   whatever the bucket holds, with a retry-after of at least the lag: the bucket bounds
   join work at a fixed rate, but the rate one core carries depends on the machine and
   on the sessions it already serves (a storm at 100 joins/s on a loaded 2-core machine
   cost attached sidecars their leases: docs/operate/failure-model.md). Re-attaches
   still pass (guarantee 3).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionPolicy:
    """How many joins the assigner takes on: ``rate`` per second, ``burst`` at once after
    a quiet spell; ``rate`` 0 admits every join (no limit)."""

    rate: float = 50.0
    burst: int = 100
    max_retry_after: float = 10.0
    max_lag: float = 0.0  # seconds of event-loop lag past which new joins wait; 0: never

    def __post_init__(self) -> None:
        if self.rate < 0 or self.burst < 1 or self.max_retry_after <= 0 or self.max_lag < 0:
            raise ValueError(
                "admission needs rate >= 0, burst >= 1, max_retry_after > 0, max_lag >= 0"
            )


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    retry_after: float = 0.0  # seconds until the join should be tried again (refused only)


ADMITTED = Verdict(True)


class JoinAdmission:
    """The token bucket of one assigner's joins (module docstring)."""

    def __init__(self, policy: AdmissionPolicy, now: float) -> None:
        self.policy = policy
        self._tokens = float(policy.burst)
        self._at = now
        self._promised = now  # the next slot handed to a refused join

    def admit(self, now: float, *, reattach: bool = False, lag: float = 0.0) -> Verdict:
        """Whether a join arriving at ``now`` is taken on; ``reattach``: it reports held
        leases (always admitted, guarantee 3); ``lag``: how late the event loop runs now
        (guarantee 5)."""
        policy = self.policy
        if not reattach and 0 < policy.max_lag < lag:
            return Verdict(False, min(policy.max_retry_after, max(lag, 1.0)))
        if policy.rate == 0:
            return ADMITTED
        self._refill(now)
        if reattach:
            self._tokens = max(self._tokens - 1, -float(policy.burst))
            return ADMITTED
        if self._tokens >= 1:
            self._tokens -= 1
            return ADMITTED
        now = self._at  # the clock never runs backwards here
        slot = max(self._promised, now + (1 - self._tokens) / policy.rate)
        slot = min(slot, now + policy.max_retry_after)
        self._promised = min(slot + 1 / policy.rate, now + policy.max_retry_after)
        return Verdict(False, slot - now)

    @property
    def tokens(self) -> float:
        return self._tokens

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(
                float(self.policy.burst), self._tokens + (now - self._at) * self.policy.rate
            )
            self._at = now


class RecentLag:
    """The event loop's lag as the admission sees it (pure, the clock a parameter): the
    largest overshoot of a timed sleep recorded within the last ``window`` seconds."""

    def __init__(self, window: float = 1.0) -> None:
        self.window = window
        self._samples: list[tuple[float, float]] = []

    def record(self, now: float, overshoot: float) -> None:
        self._samples.append((now, max(0.0, overshoot)))
        self._samples = [(t, v) for t, v in self._samples if t > now - self.window]

    def value(self, now: float) -> float:
        return max((v for t, v in self._samples if t > now - self.window), default=0.0)
