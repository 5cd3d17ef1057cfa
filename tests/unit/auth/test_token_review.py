"""The TokenReview rule (pure) and the reviewer's cache: only service accounts, only tokens
issued for the configured audiences, the pod a token is bound to kept (only when the API
server names it), an accepted token asked about once per cache period, a refusal
remembered briefly, the API server not reachable never cached."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.runtime.auth.token_review import (
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    ReviewRejected,
    Subject,
    TokenReviewer,
    TokenReviewSettings,
    review_identity,
)

SA = "system:serviceaccount:shop:orders-reader"
# What kube-apiserver v1.33 answers for a token bound to a pod (tests/k8s, verbatim keys).
BOUND = {
    "authentication.kubernetes.io/credential-id": ["JTI=ee3f1432-5ead-4f52-99c1-5203ef91dc13"],
    POD_NAME_EXTRA: ["orders-7d9f-abcde"],
    POD_UID_EXTRA: ["6c06bdaa-e689-4702-85f9-ff20a7ce3adf"],
}


def status(username: str = SA, audiences: tuple[str, ...] = ("dataservice",),
           authenticated: bool = True, extra: Any = None) -> dict[str, Any]:  # fmt: skip
    user: dict[str, Any] = {"username": username}
    if extra is not None:
        user["extra"] = extra
    return {"authenticated": authenticated, "user": user, "audiences": list(audiences)}


def test_a_service_account_token_for_the_audience_is_its_username() -> None:
    assert review_identity(status(), ("dataservice",)) == Subject(SA)


def test_a_token_bound_to_a_pod_names_it() -> None:
    assert review_identity(status(extra=BOUND), ("dataservice",)) == Subject(
        SA, "orders-7d9f-abcde"
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"authentication.kubernetes.io/credential-id": ["JTI=1"]},  # not bound to a pod
        {POD_NAME_EXTRA: ["a"]},  # no uid: not the API server's shape
        {POD_NAME_EXTRA: ["a", "b"], POD_UID_EXTRA: ["u"]},
        {POD_NAME_EXTRA: "a", POD_UID_EXTRA: ["u"]},
        {POD_NAME_EXTRA: [7], POD_UID_EXTRA: ["u"]},
        {POD_NAME_EXTRA: ["a"], POD_UID_EXTRA: [""]},
        ["a"],
    ],
)
def test_no_pod_unless_the_review_names_exactly_one_with_its_uid(extra: Any) -> None:
    assert review_identity(status(extra=extra), ("dataservice",)) == Subject(SA)


def test_a_user_s_token_is_refused_whatever_pod_it_claims() -> None:
    with pytest.raises(ReviewRejected, match="not a service account"):
        review_identity(status(username="alice", extra=BOUND), ("dataservice",))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (status(authenticated=False), "not authenticated"),
        (status(audiences=("vault",)), "other audiences"),
        (status(username="alice"), "not a service account"),
        (status(username="system:serviceaccount:only-one-part"), "not a service account"),
    ],
)
def test_anything_else_is_refused(answer: dict[str, Any], why: str) -> None:
    with pytest.raises(ReviewRejected, match=why):
        review_identity(answer, ("dataservice",))


def test_answers_are_cached_per_token_and_an_unreachable_server_is_not() -> None:
    now = [0.0]
    asked: list[bytes] = []
    answers: list[Any] = [{"status": status()}]

    def post(body: bytes) -> dict[str, Any]:
        asked.append(body)
        answer = answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    reviewer = TokenReviewer(
        TokenReviewSettings(cache_seconds=60), lambda: now[0], post, audience="dataservice"
    )
    assert reviewer.identity("t1") == Subject(SA)
    now[0] = 59.0
    assert reviewer.identity("t1") == Subject(SA) and len(asked) == 1
    now[0] = 61.0
    answers[0] = ReviewRejected("the API server could not be asked")
    with pytest.raises(ReviewRejected):
        reviewer.identity("t1")
    answers[0] = {"status": status(authenticated=False)}
    with pytest.raises(ReviewRejected, match="not authenticated"):
        reviewer.identity("t1")
    answers[0] = {"status": status()}
    with pytest.raises(ReviewRejected):  # the refusal is remembered for a few seconds
        reviewer.identity("t1")
    now[0] = 70.0
    assert reviewer.identity("t1") == Subject(SA)
    assert len(asked) == 4


def test_the_review_asks_for_the_service_s_own_audience_unless_told_otherwise() -> None:
    asked: list[dict[str, Any]] = []

    def post(body: bytes) -> dict[str, Any]:
        asked.append(json.loads(body))
        return {"status": status(audiences=("ds-sidecar",))}

    own = TokenReviewer(TokenReviewSettings(), post=post, audience="ds-sidecar")
    assert own.identity("t1") == Subject(SA)
    assert asked[-1]["spec"]["audiences"] == ["ds-sidecar"]
    told = TokenReviewer(TokenReviewSettings(audiences=("shared",)), post=post, audience="x")
    with pytest.raises(ReviewRejected, match="other audiences than shared"):
        told.identity("t2")
    with pytest.raises(ValueError, match="needs an audience"):
        TokenReviewer(TokenReviewSettings(), post=post)
