"""The TokenReview rule (pure) and the reviewer's cache: only service accounts, only tokens
issued for the configured audiences, an accepted token asked about once per cache period,
a refusal remembered briefly, the API server not reachable never cached."""

from __future__ import annotations

from typing import Any

import pytest

from services.runtime.auth.token_review import (
    ReviewRejected,
    TokenReviewer,
    TokenReviewSettings,
    review_identity,
)

SA = "system:serviceaccount:shop:orders-reader"


def status(username: str = SA, audiences: tuple[str, ...] = ("dataservice",),
           authenticated: bool = True) -> dict[str, Any]:  # fmt: skip
    return {"authenticated": authenticated, "user": {"username": username},
            "audiences": list(audiences)}  # fmt: skip


def test_a_service_account_token_for_the_audience_is_its_username() -> None:
    assert review_identity(status(), ("dataservice",)) == SA


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

    reviewer = TokenReviewer(TokenReviewSettings(cache_seconds=60), lambda: now[0], post)
    assert reviewer.identity("t1") == SA
    now[0] = 59.0
    assert reviewer.identity("t1") == SA and len(asked) == 1
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
    assert reviewer.identity("t1") == SA
    assert len(asked) == 4
