"""How long the fetch loop's poll() waits (:meth:`Fetcher._run
<services.consumer_sidecar.fetcher.Fetcher._run>`): busy, active or quiet. Pure.

One poll()'s wait is also how long a command (a commit, an assign) may wait for the poll()
in progress: confluent-kafka serializes the calls on one handle, and nothing wakes a poll()
but a record or its timeout. A record ends the wait as it arrives, so a short timeout only
serves commands: the loop is busy (short waits) for a while after a command, and after
records only where an application's ack waits for a commit on the fetch thread
(kafka_group mode, or no commit consumer). In leased mode commits go through the commit
consumer, and polling every 2 ms for a second after each record kept a sidecar at 100
records/s busy-polling for good (issue 34).
"""

from __future__ import annotations

POLL_TIMEOUT_SECONDS = 0.05
BUSY_POLL_TIMEOUT_SECONDS = 0.002
BUSY_SECONDS = 1.0  # busy: a command (or a record, see above) within this long
# Quiet: no record, no command and nothing to retry for this long. A quiet loop polls on
# IDLE_POLL_TIMEOUT_SECONDS: 5 wake-ups a second instead of 20, which were the largest
# share of an idle sidecar's CPU (issue 34; confluent-kafka has no call that ends a poll()
# early, so this is also how long the first command after a quiet spell may wait: a grant
# or a revoke reaching a sidecar that had nothing to do for QUIET_SECONDS). Any record or
# command makes the loop active again at once.
QUIET_SECONDS = 5.0
IDLE_POLL_TIMEOUT_SECONDS = 0.2


def poll_timeout(now: float, busy_until: float, quiet_at: float) -> float:
    """How long the fetch loop's next poll() may wait: short while busy (a command, or
    records whose acks wait for commits on the fetch thread, within BUSY_SECONDS), long
    once quiet (nothing for QUIET_SECONDS), POLL_TIMEOUT_SECONDS in between."""
    if now < busy_until:
        return BUSY_POLL_TIMEOUT_SECONDS
    if now < quiet_at:
        return POLL_TIMEOUT_SECONDS
    return IDLE_POLL_TIMEOUT_SECONDS
