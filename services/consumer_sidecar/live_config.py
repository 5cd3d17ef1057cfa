"""The group's ``consumer_config``, applied live (ARCHITECTURE §5.5).

The assigner sends the group's config with ``SessionAccepted`` (at every join) and in a
``ConfigUpdate`` after every change; each carries the group's config version. The sidecar
applies the newest one it was offered, one at a time, without a restart and without giving
up a lease:

* the properties outside the allow-list (:mod:`services.runtime.consumer_config`; only a
  group record written before the allow-list existed can hold one) are dropped, and the
  drop is reported like a refusal;
* :func:`~services.runtime.consumer_config.plan` says whether the running consumer must
  be replaced — librdkafka changes no property of a running client, so it must unless only
  kafka_group's membership timers changed in leased mode — and the :data:`Replace` callback
  the sidecar wires replaces it in place (leased: ``Fetcher.replace_consumer``, at the
  buffer's positions, leases and in-flight records untouched; kafka_group: a new member
  under the same static id, ``KafkaGroupMode.apply``);
* a config librdkafka refuses leaves the old one running and is remembered as the
  rejection (version and reason).

What runs — the version, the group's properties and the whole effective configuration —
and the last rejection are what the session reports in every heartbeat and what ``Status``
shows. Versions only go up: an offer older than what runs or was refused is ignored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import structlog
from confluent_kafka import KafkaException

from services.runtime.consumer_config import ALLOWED, kafka_error_text, plan, refusal

log = structlog.get_logger(__name__)

# Replaces the running consumer by one built with these group properties; raises
# KafkaException (the old one keeps running) if librdkafka refuses them.
Replace = Callable[[dict[str, str]], Awaitable[None]]
# The whole configuration the fetch consumer runs with these group properties (Status).
Effective = Callable[[dict[str, str]], dict[str, str]]


@dataclass(frozen=True)
class Rejection:
    version: int
    reason: str


@dataclass(frozen=True)
class Applied:
    version: int  # 0: nothing offered yet (the sidecar's own configuration)
    group: dict[str, str] = field(default_factory=dict)  # the group's properties that run
    effective: dict[str, str] = field(default_factory=dict)  # what Status shows


class LiveConfig:
    def __init__(
        self,
        *,
        replace: Replace,
        effective: Effective,
        kafka_group: Callable[[], bool],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``kafka_group``: the group's mode (known once joined); ``on_change``: called when
        what runs or the rejection changed (the session sends a heartbeat at once)."""
        self._replace = replace
        self._effective = effective
        self._kafka_group = kafka_group
        self.on_change = on_change
        self.applied = Applied(0, {}, effective({}))
        self.rejected: Rejection | None = None
        self._offered: tuple[int, dict[str, str]] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def offer(self, version: int, config: Mapping[str, str]) -> None:
        """The group's config at ``version`` (a join's or a ConfigUpdate's): applied by
        :meth:`run` unless a newer one is offered first."""
        newest = max(self.applied.version, self.rejected.version if self.rejected else 0)
        if self._offered is not None:
            newest = max(newest, self._offered[0])
        if version < newest or (version == newest and version == self.applied.version):
            return
        self._offered = (version, dict(config))
        self._idle.clear()
        self._wake.set()

    async def settled(self) -> None:
        """Wait until every offer so far was applied or refused."""
        await self._idle.wait()

    async def run(self) -> None:
        """Apply offers as they come, the newest first, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._offered is not None:
                (version, config), self._offered = self._offered, None
                await self._apply(version, config)
            self._idle.set()

    async def _apply(self, version: int, config: dict[str, str]) -> None:
        dropped = sorted(k for k in config if k not in ALLOWED)
        group = {k: v for k, v in config.items() if k not in dropped}
        change = plan(self.applied.group, group, kafka_group=self._kafka_group())
        if change.new_consumer:
            try:
                await self._replace(group)
            except KafkaException as exc:
                self._reject(version, kafka_error_text(exc))
                return
        self.applied = Applied(version, group, self._effective(group))
        log.info(
            "group consumer config applied",
            version=version,
            changed=sorted(change.keys),
            new_consumer=change.new_consumer,
        )
        if dropped:
            self._reject(
                version,
                "; ".join(f"{key!r} {refusal(key)}: dropped" for key in dropped),
                applied=True,
            )
            return
        self.rejected = None
        self.on_change()

    def _reject(self, version: int, reason: str, *, applied: bool = False) -> None:
        self.rejected = Rejection(version, reason)
        log.error(
            "group consumer config not applied"
            if not applied
            else "group consumer config applied without properties the sidecar may not run",
            version=version,
            reason=reason,
            running=self.applied.version,
        )
        self.on_change()
