"""DsGroup documents (the resource dsctl apply and the Kubernetes operator read) for the tests."""

from __future__ import annotations


def dsgroup(name: str, topics: list[str], **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "dataservice.io/v1alpha1",
        "kind": "DsGroup",
        "metadata": {"name": name},
        "spec": {"topics": topics, **spec},
    }
