"""The webhook relay's retry policy, per destination (pure: no I/O; the clock is a parameter).

A destination (a webhook URL) whose POST fails in a way retrying may fix (5xx, 408, 429, a
timeout, a refused connection) is backed off: ``first_backoff`` (0.5 s) doubling to
``max_backoff`` (60 s) between attempts, while the other destinations go on.

The retry budget is the destination's, not each item's (issue 37): once a destination has
failed ``max_attempts`` attempts in a row (12: about 5 min of failing from the first), the
attempt that failed last dead-letters *every* item that was waiting for it when that
attempt began, in bulk, and so does each later failed attempt for the items queued since
the one before. So a destination down for long holds at most one backoff's worth of items
(60 s of them), not everything since it went down; and no item is dead-lettered without an
attempt to its destination, made after the item was queued, having failed.

Independently, a failed attempt dead-letters the destination's items waiting longer than
``max_age_seconds`` (default 1 h): a destination that fails often but never
``max_attempts`` times in a row, or a backlog it cannot drain, does not keep items for ever.

One success ends a run of failures: the destination starts afresh and its waiting items
are sent in order. A run of failures no attempt has continued for ``stale_after``
(twice ``max_backoff``: nothing was waiting for the destination meanwhile) is forgotten, so
the next item gets a full budget. After a restart a destination's run is resumed from its
oldest item's recorded failed attempts (a lower bound: they were all in a row).

A permanent refusal (4xx, a redirect, the egress policy) is the item's alone: it is
dead-lettered and the destination's run is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

# The defaults of the settings webhook_max_attempts and webhook_max_age_seconds.
MAX_WEBHOOK_ATTEMPTS = 12
MAX_WEBHOOK_AGE_SECONDS = 3600.0


@dataclass(frozen=True)
class Budget:
    """A destination's retry budget and backoff."""

    max_attempts: int = MAX_WEBHOOK_ATTEMPTS
    max_age_seconds: float = MAX_WEBHOOK_AGE_SECONDS
    first_backoff: float = 0.5
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.max_age_seconds <= 0 or self.first_backoff <= 0:
            raise ValueError("max_age_seconds and first_backoff must be positive")
        if self.max_backoff < self.first_backoff:
            raise ValueError("max_backoff must be at least first_backoff")

    def backoff(self, failures: int) -> float:
        """The wait after the ``failures``-th failed attempt in a row (``failures`` ≥ 1)."""
        return min(self.first_backoff * 2.0 ** min(failures - 1, 64), self.max_backoff)

    def span_seconds(self) -> float:
        """From a destination's first failed attempt to the one that spends its budget,
        if it fails every attempt: the sum of the waits in between."""
        return sum(self.backoff(n) for n in range(1, self.max_attempts))

    @property
    def stale_after(self) -> float:
        return 2 * self.max_backoff


@dataclass(frozen=True)
class Destination:
    """A destination's current run of failed attempts (times on a monotonic clock)."""

    failures: int
    first_failed_at: float
    last_failed_at: float
    retry_at: float

    def may_try(self, now: float) -> bool:
        return now >= self.retry_at

    def spent(self, budget: Budget) -> bool:
        return self.failures >= budget.max_attempts


@dataclass(frozen=True)
class Failed:
    """What one failed attempt decides: the destination's run, and which of its waiting
    items to dead-letter: those queued up to ``spent_up_to_seq`` (the budget is spent;
    None: it is not) and those created before ``expired_before_ms`` (max age)."""

    destination: Destination
    spent_up_to_seq: int | None
    expired_before_ms: int
    spent_reason: str
    expired_reason: str


def resumed(recorded_failures: int, now: float) -> Destination | None:
    """A destination first seen (after a restart) whose oldest item has
    ``recorded_failures`` failed attempts: its run resumes from them, tried now."""
    if recorded_failures <= 0:
        return None
    return Destination(recorded_failures, now, now, now)


def failed(
    run: Destination | None,
    budget: Budget,
    *,
    now: float,
    now_ms: int,
    queued_up_to_seq: int,
    error: str,
) -> Failed:
    """An attempt to a destination (in run ``run``, None if it had none) failed with
    ``error``; ``queued_up_to_seq``: the last outbox seq queued before the attempt began."""
    if run is None or now - run.last_failed_at > budget.stale_after:
        run = Destination(0, now, now, now)
    failures = run.failures + 1
    after = Destination(failures, run.first_failed_at, now, now + budget.backoff(failures))
    spent = after.spent(budget)
    over = now - after.first_failed_at
    return Failed(
        destination=after,
        spent_up_to_seq=queued_up_to_seq if spent else None,
        expired_before_ms=now_ms - int(budget.max_age_seconds * 1000),
        spent_reason=(
            f"permanent: retry budget spent ({failures} failed attempts in a row to this "
            f"destination over {over:.0f}s; webhook_max_attempts {budget.max_attempts}): "
            f"{error}"
        ),
        expired_reason=(
            f"permanent: waited over {budget.max_age_seconds:.0f}s "
            f"(webhook_max_age_seconds) for a destination failing: {error}"
        ),
    )


def forget_stale(runs: dict[str, Destination], budget: Budget, now: float) -> None:
    """Drop the runs no attempt has continued for ``stale_after`` (bounds the map too)."""
    for url in [u for u, r in runs.items() if now - r.last_failed_at > budget.stale_after]:
        del runs[url]
