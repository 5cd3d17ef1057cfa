"""How long each of the sidecar's background loops may sleep (issue 34: no work while idle).

Pure: each takes the state it needs and the time now, and answers with seconds to sleep,
or None for "until woken" (:mod:`services.consumer_sidecar.wakeup`): nothing the loop
watches has a deadline, and only an event (a delivery, an ack, a pause) can give it one.
A sidecar with no traffic and no client thus wakes for its heartbeat and the fetch loop's
poll, not for these loops.
"""

from __future__ import annotations

import math

# While records are in flight, the redelivery loop looks again at least this often: a
# delayed nack may set an ack deadline earlier than the one it sleeps towards.
REDELIVERY_CHECK_SECONDS = 0.5
# The held partitions' committed offsets are read back at most this often in the
# background (issue 23's check for a commit this sidecar did not make, on partitions
# nobody commits: a partition being committed is read back right before its commit). The
# holder's report of such a commit is how the mesh follows it in time: the assigner's
# commit log is only the safety net (5 s, tried, missed tests/e2e/test_external_reset.py's
# 5 s bound). One heartbeat period: the report goes out with the next heartbeat anyway,
# and at 0.5 s the sweep cost an idle sidecar ~10 wake-ups a second (issue 34).
EXTERNAL_SWEEP_SECONDS = 1.0


def redelivery_wait(next_deadline: float, now: float) -> float | None:
    """Until the earliest ack deadline of a record in flight (at most
    :data:`REDELIVERY_CHECK_SECONDS`); None with nothing in flight (``inf``): until a
    delivery or a delayed nack."""
    if math.isinf(next_deadline):
        return None
    return min(max(0.0, next_deadline - now), REDELIVERY_CHECK_SECONDS)


def commit_wait(pending: bool, interval: float, lease_deadline: float, now: float) -> float | None:
    """The commit loop: ``interval`` while something waits to be committed (acks since the
    last commit); and no later than the earliest local lease deadline, when an expired
    lease must be suspended (fencing). None with neither: until an ack, a renewal or a
    commit asked for."""
    waits = [interval] if pending else []
    if not math.isinf(lease_deadline):
        waits.append(max(0.0, lease_deadline - now))
    return min(waits) if waits else None


def external_sweep_interval(check_interval: float) -> float:
    """How often the background check reads back every held partition's committed offset:
    ``external_check_interval_seconds`` if longer, else :data:`EXTERNAL_SWEEP_SECONDS`."""
    return max(check_interval, EXTERNAL_SWEEP_SECONDS)
