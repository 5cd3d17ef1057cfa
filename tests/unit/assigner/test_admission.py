"""The join admission policy (services/assigner/admission.py): each guarantee of its
docstring as a Hypothesis property."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.assigner.admission import AdmissionPolicy, JoinAdmission

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
