"""Property tests of the webhook relay's per-destination retry budget
(``services/notifier/webhook_budget.py``): the backoff, when the budget is spent, what a
failed attempt dead-letters, and that a run of failures ends on success or goes stale.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.notifier.webhook_budget import (
    Budget,
    Destination,
    failed,
    forget_stale,
    resumed,
)

PROPERTY = settings(max_examples=300, deadline=None)
BUDGETS = st.builds(
    Budget,
    max_attempts=st.integers(1, 30),
    max_age_seconds=st.floats(1, 86400),
    first_backoff=st.floats(0.01, 5),
    max_backoff=st.floats(5, 600),
)


@PROPERTY
@given(BUDGETS)
def test_the_backoff_doubles_from_the_first_to_the_cap(budget: Budget) -> None:
    waits = [budget.backoff(n) for n in range(1, 80)]
    assert waits[0] == budget.first_backoff
    assert all(a <= b for a, b in itertools.pairwise(waits))
    assert all(b == min(2 * a, budget.max_backoff) for a, b in itertools.pairwise(waits))
    assert waits[-1] == budget.max_backoff


@PROPERTY
@given(BUDGETS, st.lists(st.floats(0, 1), min_size=1, max_size=40), st.integers(0, 10**6))
def test_a_destination_failing_every_attempt_spends_its_budget_at_max_attempts(
    budget: Budget, lateness: list[float], start: int
) -> None:
    """Tried when allowed (up to 1 s late: a POST's time, the relay's round), failing each
    time: nothing is dead-lettered for the budget before the max_attempts-th failure in a
    row; from it on, each failure dead-letters everything queued before it; the run spans
    span_seconds plus the lateness."""
    now, run, seq = float(start), None, 0
    for n, late in enumerate(lateness, start=1):
        seq += 7  # items queued since the last attempt
        decision = failed(run, budget, now=now, now_ms=int(now * 1000), queued_up_to_seq=seq,
                          error="HTTP 503")  # fmt: skip
        run = decision.destination
        assert run.failures == n
        assert run.retry_at == now + budget.backoff(n)
        assert not run.may_try(run.retry_at - 0.001) and run.may_try(run.retry_at)
        if n < budget.max_attempts:
            assert decision.spent_up_to_seq is None and not run.spent(budget)
        else:
            assert decision.spent_up_to_seq == seq and run.spent(budget)
            assert "retry budget spent" in decision.spent_reason
            assert decision.spent_reason.endswith("HTTP 503")
        if n == budget.max_attempts:
            lateness_sum = sum(lateness[: n - 1])
            assert now - run.first_failed_at == pytest.approx(budget.span_seconds() + lateness_sum)
        now = run.retry_at + late


@PROPERTY
@given(BUDGETS, st.integers(0, 2**40))
def test_a_failed_attempt_expires_items_older_than_the_max_age(budget: Budget, now_ms: int) -> None:
    decision = failed(None, budget, now=5.0, now_ms=now_ms, queued_up_to_seq=1, error="e")
    assert decision.expired_before_ms == now_ms - int(budget.max_age_seconds * 1000)
    assert "webhook_max_age_seconds" in decision.expired_reason


@PROPERTY
@given(BUDGETS, st.integers(1, 50), st.floats(0, 10_000))
def test_a_run_no_attempt_continued_for_stale_after_starts_afresh(
    budget: Budget, failures: int, extra: float
) -> None:
    run = Destination(failures, 0.0, 100.0, 100.0 + budget.backoff(failures))
    later = 100.0 + budget.stale_after + 0.001 + extra
    decision = failed(run, budget, now=later, now_ms=0, queued_up_to_seq=9, error="e")
    assert decision.destination.failures == 1
    assert decision.destination.first_failed_at == later
    assert decision.spent_up_to_seq is (9 if budget.max_attempts == 1 else None)
    runs = {"a": run, "b": Destination(1, later, later, later)}
    forget_stale(runs, budget, later)
    assert list(runs) == ["b"]


@PROPERTY
@given(BUDGETS, st.integers(1, 50))
def test_a_run_continued_within_stale_after_goes_on(budget: Budget, failures: int) -> None:
    run = Destination(failures, 0.0, 100.0, 100.0 + budget.backoff(failures))
    later = 100.0 + budget.stale_after * 0.99  # (not at the very edge: float rounding)
    decision = failed(run, budget, now=later, now_ms=0, queued_up_to_seq=9, error="e")
    assert decision.destination.failures == failures + 1
    assert decision.destination.first_failed_at == 0.0
    runs = {"a": run}
    forget_stale(runs, budget, later)
    assert runs == {"a": run}


@PROPERTY
@given(st.integers(-5, 100), st.floats(0, 1e6))
def test_after_a_restart_a_run_resumes_from_its_oldest_items_recorded_failures(
    recorded: int, now: float
) -> None:
    run = resumed(recorded, now)
    if recorded <= 0:
        assert run is None
    else:
        assert run is not None and run.failures == recorded and run.may_try(now)


def test_a_budget_must_make_sense() -> None:
    for bad in (
        {"max_attempts": 0},
        {"max_age_seconds": 0},
        {"first_backoff": 0},
        {"first_backoff": 2.0, "max_backoff": 1.0},
    ):
        with pytest.raises(ValueError):
            Budget(**bad)  # type: ignore[arg-type]


def test_the_default_budget_is_spent_after_about_5_minutes() -> None:
    budget = Budget()
    print("default budget:", budget.max_attempts, "attempts over", budget.span_seconds(), "s")
    assert budget.span_seconds() == 0.5 + 1 + 2 + 4 + 8 + 16 + 32 + 60 * 4
