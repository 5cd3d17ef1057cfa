"""The operator's loop: renew or follow the Lease, and while leading, one reconcile pass
over every DsGroup each interval (level-triggered: a missed event is caught by the next
pass; no watch to lose)."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from services.operator.election import LeaseElector
from services.operator.kube import KubeApi
from services.operator.reconcile import Admin, Reconciler
from services.operator.settings import OperatorSettings

log = structlog.get_logger(__name__)


async def run(settings: OperatorSettings, stop: asyncio.Event) -> None:
    kube = await KubeApi.connect(str(settings.kubeconfig) if settings.kubeconfig else None)
    elector = LeaseElector(
        kube,
        settings.lease_name,
        settings.lease_namespace,
        settings.identity,
        settings.lease_duration_seconds,
    )
    reconciler = Reconciler(kube, Admin(settings.assigner))
    log.info(
        "started",
        identity=settings.identity,
        lease=f"{settings.lease_namespace}/{settings.lease_name}",
        namespace=settings.namespace or "(all)",
        assigner=settings.assigner,
    )
    try:
        while not stop.is_set():
            try:
                if await elector.step():
                    await _pass(kube, reconciler, elector, settings.namespace)
            except Exception:
                log.exception("pass failed; next one in an interval")
            else:
                if settings.alive_file is not None:
                    settings.alive_file.touch()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.interval_seconds)
    finally:
        with contextlib.suppress(Exception):
            await elector.release()
        log.info("stopped")


async def _pass(
    kube: KubeApi, reconciler: Reconciler, elector: LeaseElector, namespace: str
) -> None:
    for resource in await kube.list_groups(namespace):
        if not elector.leading:  # the Lease ran out mid-pass: stop writing
            return
        try:
            await reconciler.reconcile(resource)
        except Exception:
            meta = resource.get("metadata") or {}
            log.exception(
                "reconcile failed", resource=f"{meta.get('namespace')}/{meta.get('name')}"
            )
