"""The few Kubernetes API calls the operator makes, over kr8s's authenticated session
(a kubeconfig, or the pod's service account in cluster): each answers its HTTP status
and JSON body, so callers decide what a 404 or a 409 means."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import kr8s.asyncio

GROUP_VERSION = "dataservice.io/v1alpha1"
LEASES_VERSION = "coordination.k8s.io/v1"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message") or self.body or self.status)


class KubeApi:
    """REST calls against one API server."""

    def __init__(self, api: Any) -> None:
        self._api = api

    @classmethod
    async def connect(cls, kubeconfig: str | None) -> KubeApi:
        return cls(await kr8s.asyncio.api(kubeconfig=kubeconfig))

    async def call(
        self,
        method: str,
        version: str,
        url: str,
        *,
        namespace: str | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        async with self._api.call_api(
            method,
            version=version,
            namespace=namespace or None,
            url=url,
            raise_for_status=False,
            **kwargs,
        ) as response:
            try:
                data = response.json()
            except ValueError:
                data = {"message": response.text[:500]}
        return Answer(response.status_code, data if isinstance(data, dict) else {})

    async def list_groups(self, namespace: str) -> list[dict[str, Any]]:
        answer = await self.call("GET", GROUP_VERSION, "dsgroups", namespace=namespace)
        if not answer.ok:
            raise KubeError(f"list dsgroups: {answer.status} {answer.message}")
        items: list[dict[str, Any]] = answer.body.get("items") or []
        for item in items:  # a list's items may leave out their type
            item.setdefault("apiVersion", GROUP_VERSION)
            item.setdefault("kind", "DsGroup")
        return items

    async def patch_group(
        self, resource: dict[str, Any], patch: dict[str, Any], *, status: bool = False
    ) -> Answer:
        meta = resource["metadata"]
        url = f"dsgroups/{meta['name']}" + ("/status" if status else "")
        return await self.call(
            "PATCH",
            GROUP_VERSION,
            url,
            namespace=meta["namespace"],
            body=patch,
            content_type=MERGE_PATCH,
        )


class KubeError(RuntimeError):
    """The API server refused or failed a call the operator cannot go on without."""
