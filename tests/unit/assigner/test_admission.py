"""The join admission policy (services/assigner/admission.py): each guarantee of its
docstring as a Hypothesis property."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.assigner.admission import AdmissionPolicy, JoinAdmission, RecentLag

policies = st.builds(
    AdmissionPolicy,
    rate=st.floats(0.5, 1000),
    burst=st.integers(1, 500),
    max_retry_after=st.floats(0.1, 60),
)
# Arrivals: gaps between joins (seconds, many at the same instant) and whether each
# reports held leases.
arrivals = st.lists(
    st.tuples(st.one_of(st.just(0.0), st.floats(0, 2)), st.booleans()), max_size=400
)


@given(policies, arrivals)
def test_new_joins_admitted_over_any_span_stay_within_burst_plus_rate(
    policy: AdmissionPolicy, joins: list[tuple[float, bool]]
) -> None:
    admission = JoinAdmission(policy, 0.0)
    now, admitted = 0.0, []
    for gap, reattach in joins:
        now += gap
        if admission.admit(now, reattach=reattach).admitted and not reattach:
            admitted.append(now)
    # Every span [admitted[i], admitted[j]]: j - i + 1 joins in (admitted[j] - admitted[i]) s.
    for i in range(len(admitted)):
        for j in range(i, len(admitted)):
            span = admitted[j] - admitted[i]
            assert j - i + 1 <= policy.burst + policy.rate * span + 1e-6


@given(policies, st.lists(st.floats(0, 5), max_size=200))
def test_joins_arriving_at_most_at_the_rate_are_all_admitted(
    policy: AdmissionPolicy, extra_gaps: list[float]
) -> None:
    admission = JoinAdmission(policy, 0.0)
    now = 0.0
    for extra in extra_gaps:
        now += 1 / policy.rate * (1 + 1e-9) + extra
        assert admission.admit(now).admitted


@given(policies, arrivals)
def test_a_reattach_is_always_admitted(
    policy: AdmissionPolicy, joins: list[tuple[float, bool]]
) -> None:
    admission = JoinAdmission(policy, 0.0)
    now = 0.0
    for gap, reattach in joins:
        now += gap
        verdict = admission.admit(now, reattach=reattach)
        if reattach:
            assert verdict.admitted
        assert admission.tokens >= -policy.burst


@given(policies, arrivals)
def test_a_refusal_names_a_retry_after_within_the_bound(
    policy: AdmissionPolicy, joins: list[tuple[float, bool]]
) -> None:
    admission = JoinAdmission(policy, 0.0)
    now = 0.0
    for gap, reattach in joins:
        now += gap
        verdict = admission.admit(now, reattach=reattach)
        if verdict.admitted:
            assert verdict.retry_after == 0
        else:
            assert 0 < verdict.retry_after <= policy.max_retry_after + 1e-9


@given(policies, st.integers(1, 1000))
def test_a_storm_is_handed_slots_at_the_refill_rate(policy: AdmissionPolicy, storm: int) -> None:
    """Joins refused at one instant come back one slot 1/rate apart (until the cap), so
    they return no faster than the bucket refills."""
    admission = JoinAdmission(policy, 0.0)
    verdicts = [admission.admit(0.0) for _ in range(policy.burst + storm)]
    assert all(v.admitted for v in verdicts[: policy.burst])
    refused = [v.retry_after for v in verdicts[policy.burst :]]
    assert not any(v.admitted for v in verdicts[policy.burst :])
    for earlier, later in itertools.pairwise(refused):
        if later < policy.max_retry_after - 1e-9:
            assert later - earlier == pytest.approx(1 / policy.rate)
        else:
            assert later >= earlier


def test_rate_zero_admits_everything() -> None:
    admission = JoinAdmission(AdmissionPolicy(rate=0, burst=1), 0.0)
    assert all(admission.admit(0.0).admitted for _ in range(10_000))


def test_a_policy_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        AdmissionPolicy(rate=-1)
    with pytest.raises(ValueError):
        AdmissionPolicy(burst=0)


@given(policies, st.floats(0.01, 30), st.floats(0, 60))
def test_new_joins_wait_while_the_loop_is_late_and_reattaches_pass(
    policy: AdmissionPolicy, max_lag: float, lag: float
) -> None:
    policy = AdmissionPolicy(policy.rate, policy.burst, policy.max_retry_after, max_lag)
    admission = JoinAdmission(policy, 0.0)
    fresh = admission.admit(0.0, lag=lag)
    if lag > max_lag:
        # Refused whatever the bucket holds (it is full), told to wait at least the lag
        # (and a second), within the policy's bound.
        assert not fresh.admitted
        assert fresh.retry_after == min(policy.max_retry_after, max(lag, 1.0))
        assert admission.tokens == policy.burst  # nothing spent
    else:
        assert fresh.admitted
    assert admission.admit(0.0, reattach=True, lag=lag).admitted


def test_no_lag_limit_admits_whatever_the_lag() -> None:
    admission = JoinAdmission(AdmissionPolicy(rate=10, burst=1, max_lag=0), 0.0)
    assert admission.admit(0.0, lag=100.0).admitted


def test_recent_lag_is_the_largest_overshoot_within_the_window() -> None:
    lag = RecentLag(window=1.0)
    assert lag.value(0.0) == 0.0
    lag.record(0.0, 0.4)
    lag.record(0.5, 0.1)
    lag.record(0.6, -0.05)  # woke early: no lag
    assert lag.value(0.6) == 0.4
    assert lag.value(1.2) == 0.1  # the 0.4 s sample is older than the window
    assert lag.value(3.0) == 0.0
