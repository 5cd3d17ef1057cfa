"""What the operator writes as a DsGroup's status (pure): the live group's numbers
(:func:`services.dsctl.group_manifest.status_of`), the generation last applied, and the
conditions Ready (the group exists as the resource's last generation declared it) and
Drifted (a managed field was changed outside Kubernetes since, e.g. with ``dsctl``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataservice.assigner.v1 import admin_pb2
from services.dsctl import group_manifest as manifest


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def condition_list(
    conditions: Sequence[Condition],
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """Conditions as the API stores them; a condition whose status did not change keeps
    its lastTransitionTime."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in conditions:
        status = "True" if c.status else "False"
        old = before.get(c.type) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": c.type,
                "status": status,
                "reason": c.reason,
                "message": c.message,
                "observedGeneration": generation,
                "lastTransitionTime": since or now,
            }
        )
    return out


def drifted_keys(resource: Mapping[str, Any], live: admin_pb2.DescribeGroupResponse) -> list[str]:
    """The managed spec keys whose live value differs from the resource's."""
    desired = manifest.config_of(resource)
    return manifest.changed_spec_keys(live.config, desired, manifest.managed_keys(resource))


def live_status(
    resource: Mapping[str, Any],
    live: admin_pb2.DescribeGroupResponse | None,
    applied_generation: int | None,
    problem: Condition | None,
    now: str,
) -> dict[str, Any]:
    """The status for ``resource`` given the live group (None: it does not exist) and the
    generation last applied; ``problem`` is the Ready=False condition of a failed pass."""
    previous = ((resource.get("status") or {}).get("conditions")) or []
    generation = int(resource["metadata"].get("generation") or 0)
    status: dict[str, Any] = {"groupName": manifest.group_name(resource)}
    if live is not None:
        status.update(manifest.status_of(live))
    if applied_generation is not None:
        status["observedGeneration"] = applied_generation
    conditions: list[Condition] = []
    if problem is not None:
        conditions.append(problem)
    elif live is None:
        conditions.append(
            Condition(
                "Ready",
                False,
                "GroupMissing",
                "the group does not exist in the mesh (deleted outside Kubernetes?); the "
                "operator creates it again on the resource's next change",
            )
        )
    else:
        conditions.append(
            Condition(
                "Ready",
                True,
                "Applied",
                f"config v{live.config.config_version}, {len(live.members)} member(s)",
            )
        )
    if live is not None:
        drift = drifted_keys(resource, live)
        conditions.append(
            Condition(
                "Drifted",
                bool(drift),
                "ChangedOutsideKubernetes" if drift else "InSync",
                (
                    f"{', '.join(drift)} changed in the mesh since generation "
                    f"{applied_generation} was applied; kept until the resource changes"
                )
                if drift
                else "the live group matches the resource",
            )
        )
    status["conditions"] = condition_list(conditions, previous, generation, now)
    return status


def same_status(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether merging ``new`` into ``old`` (a merge patch) would change nothing; the
    timestamps of unchanged conditions are carried over by :func:`condition_list`."""
    before = old or {}
    return all(before.get(key) == value for key, value in new.items())
