"""The webhook's answer to AdmissionReviews (services/injector/admission.py): the JSONPatch,
applied to the pod the API server sent, gives exactly the pod the patch module injects."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings

from services.injector.admission import BadReview, answer
from services.injector.patch import GROUP, INJECT, Action, inject_pod
from services.injector.template import SidecarTemplate
from tests.support.pods import pod_templates

TEMPLATE = SidecarTemplate()


def review(pod: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": operation,
            "object": pod,
            "dryRun": False,
        },
    }


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "orders-7d9f-",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": {
            "containers": [{"name": "app", "image": "orders:1"}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def patched(original: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(original), operations)  # type: ignore[no-any-return]


def test_an_opted_in_pod_is_patched_into_the_injected_pod() -> None:
    original = pod(annotations={GROUP: "orders"}, labels={INJECT: "true"})
    result = answer(review(original), TEMPLATE)
    response = result.review["response"]
    assert result.review["apiVersion"] == "admission.k8s.io/v1"
    assert result.review["kind"] == "AdmissionReview"
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert result.action is Action.INJECTED
    assert patched(original, response) == inject_pod(original, "orders", TEMPLATE)


@given(pod_templates())
@settings(max_examples=100)
def test_the_patch_gives_what_inject_pod_gives(template_pod: dict[str, Any]) -> None:
    original = {"apiVersion": "v1", "kind": "Pod", **template_pod}
    original["metadata"] = {**original["metadata"], "annotations": {GROUP: "g", INJECT: "true"}}
    response = answer(review(original), TEMPLATE).review["response"]
    expected = inject_pod(original, "g", TEMPLATE)
    if expected == original:
        assert "patch" not in response
    else:
        assert patched(original, response) == expected


def test_an_injected_pod_gets_no_patch() -> None:
    injected = inject_pod(pod(annotations={GROUP: "orders"}), "orders", TEMPLATE)
    result = answer(review(injected), TEMPLATE)
    assert result.action is Action.UNCHANGED
    assert result.review["response"] == {"uid": result.review["response"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("body", "action"),
    [
        (review(pod(annotations={GROUP: "g", INJECT: "false"})), Action.SKIPPED),
        (review(pod(annotations={GROUP: "g"}), operation="UPDATE"), Action.SKIPPED),
        (review(pod(annotations={GROUP: "g"}), kind="Service"), Action.SKIPPED),
    ],
)
def test_admitted_unchanged(body: dict[str, Any], action: Action) -> None:
    result = answer(body, TEMPLATE)
    assert result.action is action
    assert result.review["response"] == {"uid": body["request"]["uid"], "allowed": True}


def test_a_pod_without_a_group_is_admitted_with_a_warning() -> None:
    result = answer(review(pod(labels={INJECT: "true"})), TEMPLATE)
    response = result.review["response"]
    assert result.action is Action.FAILED
    assert response["allowed"] is True and "patch" not in response
    assert "dataservice.io/group" in response["warnings"][0]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 3}},
    ],
)
def test_not_a_review(body: Any) -> None:
    with pytest.raises(BadReview):
        answer(body, TEMPLATE)
