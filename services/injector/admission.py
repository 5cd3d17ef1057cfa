"""The webhook's answer to an ``AdmissionReview`` (admission.k8s.io/v1), pure: the review
in, the review to send back out.

The API server calls the webhook only for pods its MutatingWebhookConfiguration selects (a
namespace or a pod labelled ``dataservice.io/inject: "true"``, deploy/k8s/base/injector.yaml),
so a called pod is injected by default unless it opts out. The change is the pod that
:func:`services.injector.patch.inject_pod` makes, sent as a JSONPatch (RFC 6902, computed
with the ``jsonpatch`` package) against the pod the API server sent. The webhook never
refuses a pod: one it cannot inject (no group) is admitted unchanged with a warning, which
``kubectl`` prints.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from services.injector.patch import Action, decide, has_sidecar, inject_pod
from services.injector.template import SidecarTemplate

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class BadReview(ValueError):
    """The request body is not an AdmissionReview v1 this webhook can answer (HTTP 400)."""


@dataclass(frozen=True)
class Answer:
    """The review to send back, and what happened (for logs and metrics)."""

    review: dict[str, Any]
    action: Action
    reason: str


def _response(uid: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": {"uid": uid, **fields}}


def answer(review: Any, template: SidecarTemplate) -> Answer:
    """The answer to one AdmissionReview; :class:`BadReview` if it is not one."""
    if not isinstance(review, Mapping):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
        raise BadReview(f"expected {KIND} {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise BadReview("the review has no request with a uid")
    uid = request["uid"]
    kind = request.get("kind") or {}
    pod = request.get("object")
    if kind.get("kind") != "Pod" or kind.get("group", "") != "" or not isinstance(pod, Mapping):
        return Answer(_response(uid, allowed=True), Action.SKIPPED, "not a pod")
    if request.get("operation") != "CREATE":
        return Answer(_response(uid, allowed=True), Action.SKIPPED, "not a CREATE")
    decision = decide(pod.get("metadata"), default=True)
    if not decision.inject or decision.group is None:
        action = Action.FAILED if decision.error else Action.SKIPPED
        fields: dict[str, Any] = {"allowed": True}
        if decision.error:
            fields["warnings"] = [f"dataservice sidecar not injected: {decision.reason}"]
        return Answer(_response(uid, **fields), action, decision.reason)
    injected = inject_pod(pod, decision.group, template)
    operations = jsonpatch.make_patch(dict(pod), injected).patch
    if not operations:
        return Answer(_response(uid, allowed=True), Action.UNCHANGED, "already injected")
    patch = base64.b64encode(json.dumps(operations).encode()).decode()
    action = Action.UPDATED if has_sidecar(pod) else Action.INJECTED
    return Answer(
        _response(uid, allowed=True, patchType="JSONPatch", patch=patch),
        action,
        f"group {decision.group}",
    )
