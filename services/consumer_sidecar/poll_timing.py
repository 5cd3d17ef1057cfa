"""How long the fetch loop's poll() waits (:meth:`Fetcher._run
<services.consumer_sidecar.fetcher.Fetcher._run>`): busy, active or quiet; and when it does
not poll at all but waits on its wake-up event (parked: nobody reads). Pure.

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
# Parked: nobody read for QUIET_SECONDS (no Stream open, no Fetch) and no command within
# BUSY_SECONDS. Nothing waits for a record then, so the loop waits on its wake-up event
# instead of in poll(): a command (a grant, a revoke) or a reader wakes it at once, where it
# waited for the poll() in progress, and every PARK_SECONDS it takes what librdkafka fetched
# meanwhile (poll(0), which serves its callbacks too). Half a second is under both the stall
# limit of the default lease (1 s, stall_watch.stall_limit_for) and the floor of a
# not-fetching gap (1 s, fetch_gaps.GAP_FLOOR_SECONDS): a parked loop is neither.
PARK_SECONDS = 0.5


def poll_timeout(now: float, busy_until: float, quiet_at: float) -> float:
    """How long the fetch loop's next poll() may wait: short while busy (a command, or
    records whose acks wait for commits on the fetch thread, within BUSY_SECONDS), long
    once quiet (nothing for QUIET_SECONDS), POLL_TIMEOUT_SECONDS in between."""
    if now < busy_until:
        return BUSY_POLL_TIMEOUT_SECONDS
    if now < quiet_at:
        return POLL_TIMEOUT_SECONDS
    return IDLE_POLL_TIMEOUT_SECONDS


def park_seconds(now: float, busy_until: float, read_at: float, stall_limit: float) -> float | None:
    """How long the fetch loop may wait on its wake-up event instead of polling (parked),
    or None to poll: parked once nobody read since ``read_at`` for QUIET_SECONDS (``inf``
    while a Stream is open) and no command came within BUSY_SECONDS (a grant's first
    records are taken as they come); PARK_SECONDS at most, and under half the stall
    limit."""
    if now < busy_until or now < read_at + QUIET_SECONDS:
        return None
    return min(PARK_SECONDS, stall_limit / 2)
