"""The render relay: turns the outbox's render jobs into alerts, on a thread of its own.

A job (``alerts.AlertRouter.alerts_for``) is rendered in the render worker
(:meth:`AlertRouter.render`: limits, route checks, disabling) and replaced by its alert in
one outbox transaction, so a crash leaves either the job or the alert, never neither; the
Kafka or webhook relay then sends it. Rendering waits at most the render time limit per
job, here and never on the Kafka relay's thread, so a hostile template cannot hold back
fault publishing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from services.notifier.alerts import AlertRouter
from services.notifier.outbox import KAFKA_LANE, RENDER_LANE, WEBHOOK_LANE, Outbox
from services.notifier.relay import IDLE_WAIT_SECONDS

log = structlog.get_logger(__name__)

BATCH = 50


class RenderRelay:
    def __init__(
        self,
        outbox: Outbox,
        router: AlertRouter,
        *,
        wake_kafka: Callable[[], None],
        wake_webhook: Callable[[], None],
    ) -> None:
        self._outbox = outbox
        self._router = router
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
        """Render the pending jobs (up to a batch); returns how many were handled."""
        handled = 0
        for job in self._outbox.pending(RENDER_LANE, BATCH):
            if self._stop.is_set():
                break
            alert = self._router.render(job)
            self._outbox.complete([job.seq], [alert] if alert is not None else [])
            handled += 1
            if alert is not None and alert.lane == KAFKA_LANE:
                self._wake_kafka()
            elif alert is not None and alert.lane == WEBHOOK_LANE:
                self._wake_webhook()
        return handled
