"""One pass over one DsGroup: the finalizer, the group created or updated through the admin
API when the resource has a generation not applied yet, deleted when the resource is, and
the status written from the live mesh.

Who wins against ``dsctl``: the resource, but only when it changes. A generation is applied
once (``status.observedGeneration`` records it): a change made with ``dsctl`` afterwards
stays and shows as the condition ``Drifted=True`` naming the fields, until the resource's
next edit applies all its managed fields again. So the two never fight in a loop, and an
operator's emergency change is not undone behind their back within seconds. A group
deleted outside Kubernetes is ``Ready=False`` (GroupMissing) and created again on the
resource's next change.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from google.protobuf import field_mask_pb2

from dataservice.assigner.v1 import admin_pb2
from services.dsctl import group_manifest as manifest
from services.dsctl.admin_client import AssignerClient, CliError, ExitCode
from services.operator.election import micro_time
from services.operator.kube import KubeApi
from services.operator.status import Condition, live_status, same_status

log = structlog.get_logger(__name__)
FINALIZER = "dataservice.io/group"
# An annotation with value "true": the resource's deletion deletes the group even while
# clients are bound (DeleteGroup with force).
FORCE_DELETE = "dataservice.io/force-delete"


@dataclass
class Admin:
    """The admin API in worker threads (dsctl's client: TLS, token and leader following
    from the same DS_* settings)."""

    address: str
    timeout: float = 10.0

    async def describe(self, group: str) -> admin_pb2.DescribeGroupResponse | None:
        try:
            return await asyncio.to_thread(self._describe, group)
        except CliError as err:
            if err.exit_code is ExitCode.NOT_FOUND:
                return None
            raise

    def _describe(self, group: str) -> admin_pb2.DescribeGroupResponse:
        with AssignerClient(self.address, self.timeout) as client:
            return client.describe(group)

    async def write(self, change: manifest.Change, live_version: int) -> None:
        await asyncio.to_thread(self._write, change, live_version)

    def _write(self, change: manifest.Change, live_version: int) -> None:
        with AssignerClient(self.address, self.timeout) as client:
            if change.action == "create":
                client.create_group(
                    admin_pb2.CreateGroupRequest(group=change.desired, request_id=_id())
                )
            elif change.action == "update":
                client.update_group(
                    admin_pb2.UpdateGroupRequest(
                        group=change.desired,
                        update_mask=field_mask_pb2.FieldMask(paths=list(change.paths)),
                        expected_config_version=live_version,
                        request_id=_id(),
                    )
                )

    async def delete(self, group: str, *, force: bool) -> None:
        await asyncio.to_thread(self._delete, group, force)

    def _delete(self, group: str, force: bool) -> None:
        with AssignerClient(self.address, self.timeout) as client:
            client.delete_group(
                admin_pb2.DeleteGroupRequest(group=group, force=force, request_id=_id())
            )


def _id() -> str:
    return str(uuid.uuid4())


class Reconciler:
    def __init__(self, kube: KubeApi, admin: Admin) -> None:
        self.kube = kube
        self.admin = admin

    async def reconcile(self, resource: dict[str, Any]) -> None:
        meta = resource["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            if FINALIZER in finalizers:
                await self._delete(resource, finalizers)
            return
        if FINALIZER not in finalizers:
            answer = await self.kube.patch_group(
                resource,
                {
                    "metadata": {
                        "finalizers": [*finalizers, FINALIZER],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )
            if not answer.ok:
                log.warning("finalizer not added", resource=_ref(resource), error=answer.message)
                return
            resource = answer.body
        await self._apply(resource)

    async def _apply(self, resource: dict[str, Any]) -> None:
        status = resource.get("status") or {}
        generation = int(resource["metadata"].get("generation") or 0)
        applied = status.get("observedGeneration")
        problem: Condition | None = None
        try:
            name = manifest.group_name(resource)
            live = await self.admin.describe(name)
            if applied != generation:  # a generation not applied yet: the resource's turn
                (change,) = manifest.plan([resource], {name: live.config} if live else {})
                if change.action != "unchanged":
                    await self.admin.write(change, live.config.config_version if live else 0)
                    log.info(
                        "group applied",
                        resource=_ref(resource),
                        group=name,
                        action=change.action,
                        fields=list(change.paths),
                    )
                    live = await self.admin.describe(name)
                applied = generation
        except manifest.ManifestError as exc:
            live, problem = None, Condition("Ready", False, "InvalidSpec", str(exc))
        except CliError as err:
            live = None
            problem = Condition("Ready", False, "ApplyFailed", err.message[:1000])
            log.warning("group not applied", resource=_ref(resource), error=err.message)
        new = live_status(resource, live, applied, problem, micro_time())
        if same_status(status, new):
            return
        answer = await self.kube.patch_group(resource, {"status": new}, status=True)
        if not answer.ok:
            log.warning("status not written", resource=_ref(resource), error=answer.message)

    async def _delete(self, resource: dict[str, Any], finalizers: list[str]) -> None:
        meta = resource["metadata"]
        force = (meta.get("annotations") or {}).get(FORCE_DELETE) == "true"
        try:
            name = manifest.group_name(resource)
            await self.admin.delete(name, force=force)
            log.info("group deleted", resource=_ref(resource), group=name, forced=force)
        except manifest.ManifestError:
            pass  # it never named a group: nothing to delete
        except CliError as err:
            if err.exit_code is not ExitCode.NOT_FOUND:  # NOT_FOUND: already gone
                problem = Condition("Ready", False, "DeleteRefused", err.message[:1000])
                new = live_status(resource, None, None, problem, micro_time())
                new.pop("observedGeneration", None)
                if not same_status(resource.get("status"), new):
                    await self.kube.patch_group(resource, {"status": new}, status=True)
                log.warning("group not deleted", resource=_ref(resource), error=err.message)
                return
        answer = await self.kube.patch_group(
            resource,
            {
                "metadata": {
                    "finalizers": [f for f in finalizers if f != FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            },
        )
        if not answer.ok:
            log.warning("finalizer not removed", resource=_ref(resource), error=answer.message)


def _ref(resource: dict[str, Any]) -> str:
    meta = resource["metadata"]
    return f"{meta.get('namespace')}/{meta.get('name')}"
