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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionPolicy:
    """How many joins the assigner takes on: ``rate`` per second, ``burst`` at once after
    a quiet spell; ``rate`` 0 admits every join (no limit)."""

    rate: float = 100.0
    burst: int = 200
    max_retry_after: float = 10.0

    def __post_init__(self) -> None:
        if self.rate < 0 or self.burst < 1 or self.max_retry_after <= 0:
            raise ValueError("admission needs rate >= 0, burst >= 1, max_retry_after > 0")


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

    def admit(self, now: float, *, reattach: bool = False) -> Verdict:
        """Whether a join arriving at ``now`` is taken on; ``reattach``: it reports held
        leases (always admitted, guarantee 3)."""
        policy = self.policy
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
