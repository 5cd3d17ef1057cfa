"""The render relay: turns the outbox's render jobs into alerts, on a thread of its own.

A job (``alerts.AlertRouter.alerts_for``) is rendered in the render worker
(:meth:`AlertRouter.render`: limits, route checks, disabling) and replaced by its alert in
one outbox transaction, so a crash leaves either the job or the alert, never neither; the
Kafka or webhook relay then sends it. Rendering waits at most the render time limit per
job, here and never on the Kafka relay's thread, so a hostile template cannot hold back
fault publishing. An alert whose webhook destination already holds its bound of pending
items is dead-lettered by that transaction instead (``outbox.py``); the round's are
reported together through the relay hooks (counted, one DEAD_LETTER per destination).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from services.notifier.alerts import AlertRouter
from services.notifier.outbox import KAFKA_LANE, RENDER_LANE, WEBHOOK_LANE, DeadLetter, Outbox
from services.notifier.relay import IDLE_WAIT_SECONDS, RelayHooks

log = structlog.get_logger(__name__)

BATCH = 50


class RenderRelay:
    def __init__(
        self,
        outbox: Outbox,
        router: AlertRouter,
        *,
        hooks: RelayHooks,
        wake_kafka: Callable[[], None],
        wake_webhook: Callable[[], None],
    ) -> None:
        """``hooks``: told of the alerts dead-lettered instead of queued (their webhook
        destination holds its bound of pending items)."""
        self._outbox = outbox
        self._router = router
        self._hooks = hooks
        self._wake_kafka = wake_kafka
        self._wake_webhook = wake_webhook
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-render", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.round()
            except Exception as exc:
                log.warning("render relay failed; retrying", error=repr(exc))
                done = 0
                self._stop.wait(1.0)
            if not done:
                self._wake.wait(IDLE_WAIT_SECONDS)  # notify() wakes it for new jobs
                self._wake.clear()

    def round(self) -> int:
        """Render the pending jobs (up to a batch); returns how many were handled. Alerts
        dead-lettered instead of queued (their webhook destination full) are reported
        together at the end of the round: one DEAD_LETTER per destination, with a count."""
        handled = 0
        dead: list[DeadLetter] = []
        try:
            for job in self._outbox.pending(RENDER_LANE, BATCH):
                if self._stop.is_set():
                    break
                alert = self._router.render(job)
                refused = self._outbox.complete([job.seq], [alert] if alert is not None else [])
                dead.extend(refused)
                handled += 1
                if alert is None or refused:
                    continue  # nothing queued
                if alert.lane == KAFKA_LANE:
                    self._wake_kafka()
                elif alert.lane == WEBHOOK_LANE:
                    self._wake_webhook()
        finally:
            self._hooks.report_dead_letters(dead)
        return handled
