"""Leader election with a coordination.k8s.io Lease, as client-go's leaderelection does:
the holder renews ``spec.renewTime`` well within ``leaseDurationSeconds``; another replica
takes the Lease over once it has seen no change of it for a whole duration (by its own
monotonic clock, so clocks that disagree do not matter); every write carries the
``resourceVersion`` read, so of two replicas racing for it one gets 409 and follows.

:func:`decide` is the rule (pure); :class:`LeaseElector` does the I/O.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from services.operator.kube import LEASES_VERSION, KubeApi

log = structlog.get_logger(__name__)
Step = Literal["create", "renew", "take", "follow"]


def decide(
    holder: str | None, me: str, unchanged_for: float | None, duration: float, exists: bool
) -> Step:
    """What to do with the Lease: ``unchanged_for`` is how long this replica has seen the
    same resourceVersion (None: it just changed, or was never seen)."""
    if not exists:
        return "create"
    if holder == me:
        return "renew"
    if not holder or (unchanged_for is not None and unchanged_for >= duration):
        return "take"
    return "follow"


def micro_time(now: datetime.datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Seen:
    version: str
    since: float  # monotonic time it was first seen


class LeaseElector:
    """Holds or follows one Lease. :meth:`step` runs one round; :attr:`leading` says whether
    this replica may act now (its last successful renewal is younger than the duration)."""

    def __init__(
        self,
        kube: KubeApi,
        name: str,
        namespace: str,
        identity: str,
        duration: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.duration = duration
        self.clock = clock
        self._seen: _Seen | None = None
        self._renewed_at: float | None = None

    @property
    def leading(self) -> bool:
        # A margin of a fifth of the duration: stop acting before another may take over.
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.duration * 0.8
        )

    async def step(self) -> bool:
        """One round: read the Lease, then create, renew, take it over or follow."""
        got = await self.kube.call(
            "GET", LEASES_VERSION, f"leases/{self.name}", namespace=self.namespace
        )
        if got.status == 404:
            return await self._write("POST", self._lease(None, transitions=0), "create")
        if not got.ok:
            log.warning("lease not read", status=got.status, error=got.message)
            return self.leading
        lease = got.body
        version = str(lease["metadata"].get("resourceVersion", ""))
        now = self.clock()
        if self._seen is None or self._seen.version != version:
            self._seen = _Seen(version, now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        step = decide(holder, self.identity, now - self._seen.since, self.duration, exists=True)
        if step == "follow":
            if self._renewed_at is not None:
                log.warning("lost the lease", holder=holder)
            self._renewed_at = None
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if step == "take":
            transitions += 1
        body = self._lease(lease, transitions=transitions, acquired=step == "take")
        return await self._write("PUT", body, step)

    def _lease(
        self, current: dict[str, Any] | None, *, transitions: int, acquired: bool = True
    ) -> dict[str, Any]:
        now = micro_time()
        spec: dict[str, Any] = dict((current or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.duration)),
            renewTime=now,
            leaseTransitions=transitions,
        )
        if acquired or "acquireTime" not in spec:
            spec["acquireTime"] = now
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": LEASES_VERSION,
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _write(self, method: str, body: dict[str, Any], step: Step) -> bool:
        url = "leases" if method == "POST" else f"leases/{self.name}"
        started = self.clock()
        answer = await self.kube.call(
            method, LEASES_VERSION, url, namespace=self.namespace, body=body
        )
        if answer.ok:
            if self._renewed_at is None:
                log.info("leading", lease=f"{self.namespace}/{self.name}", how=step)
            self._renewed_at = started
            self._seen = _Seen(str(answer.body["metadata"]["resourceVersion"]), self.clock())
            return True
        if answer.status == 409:  # another replica wrote it since it was read: follow
            self._renewed_at = None
            return False
        log.warning("lease not written", status=answer.status, error=answer.message)
        return self.leading

    async def release(self) -> None:
        """Give the Lease up on a clean stop, so another replica takes over at once."""
        if not self.leading or self._seen is None:
            return
        got = await self.kube.call(
            "GET", LEASES_VERSION, f"leases/{self.name}", namespace=self.namespace
        )
        if not got.ok or (got.body.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease = got.body
        lease["spec"]["holderIdentity"] = None
        await self.kube.call(
            "PUT", LEASES_VERSION, f"leases/{self.name}", namespace=self.namespace, body=lease
        )
        self._renewed_at = None
