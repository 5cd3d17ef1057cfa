"""The fetch loop's backpressure decisions (:meth:`Fetcher._holding
<services.consumer_sidecar.fetcher.Fetcher._holding>`, ``_apply_backpressure``): when a
full buffer holds consume() back, and which partitions pause or resume. Pure: the fetch
loop applies them (pause()/resume() on its consumer, the table's flags).

Leased mode: a partition is paused past LEASED_PARTITION_SHARE times its fair share of the
buffer (one partition's backlog must not crowd the others out); the whole buffer full holds
consume() back for up to HOLD_SECONDS, then pauses partitions. kafka_group mode never holds
back (it must keep polling, ``max.poll.interval.ms``) and pauses at once. A paused
partition resumes once its buffer falls below RESUME_FRACTION of its cap.
"""

from __future__ import annotations

RESUME_FRACTION = 0.5
LEASED_PARTITION_SHARE = 2
HOLD_SECONDS = 1.0


def partition_share(classic: bool) -> int:
    """How many times its fair share of the buffer a partition may hold before it pauses."""
    return 1 if classic else LEASED_PARTITION_SHARE


def still_holding(full_since: float, now: float) -> bool:
    """Leased mode, buffer full since ``full_since``: consume() is still held back."""
    return now - full_since < HOLD_SECONDS


def over_total(
    *,
    classic: bool,
    buffered: int,
    leased_cap: int,
    hold_at: int,
    full_since: float | None,
    holding: bool,
) -> bool:
    """Whether the whole buffer is over its cap: kafka_group mode at the cap; leased mode
    full and no longer held back (HOLD_SECONDS passed)."""
    if classic:
        return buffered >= leased_cap
    return buffered >= hold_at and full_since is not None and not holding


def pause_change(*, paused: bool, buffered: int, cap: int, over_total: bool) -> bool | None:
    """One partition's change: True pauses it, False resumes it, None leaves it as it is."""
    over = over_total or buffered >= cap
    if over and not paused:
        return True
    if paused and not over_total and buffered < cap * RESUME_FRACTION:
        return False
    return None
