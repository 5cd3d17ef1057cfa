"""What the sidecar's parts report, as typed events interfaces: one per part, each a frozen
set of callables handed to the part's constructor (every one a no-op unless given).

The wiring (``app.py``) builds each once: the faults, the metrics (when enabled), the data
signal that wakes a waiting Fetch or Stream, the live settings of the group. A part calls
its events and knows nothing of who listens. Each says on which thread it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dataservice.assigner.v1 import assigner_pb2
from services.consumer_sidecar.acks import GivenUp
from services.consumer_sidecar.kafka_fenced_commits import LeaseFenced
from services.runtime.topic_partition import TP


def nothing(*_args: object) -> None:
    """An event nobody listens to (every default; the metrics' when they are disabled)."""


@dataclass(frozen=True)
class FetcherEvents:
    """The fetch loop's (``fetcher.py``), all on the fetch thread."""

    # Instrumentation (metrics.py): a poll (started, returned); records consumed (topic,
    # count, bytes).
    on_poll: Callable[[float, float], None] = nothing
    on_consumed: Callable[[str, int, int], None] = nothing
    # The not-fetching gaps: records of a partition came out of consume() (partition,
    # when, the first record's timestamp in ms or -1); and every loop, the time of the
    # last poll (the gaps look at the table).
    on_fetched: Callable[[TP, float, int], None] = nothing
    on_loop: Callable[[float], None] = nothing
    # A position outside the log: (partition, first offset skipped, where fetching went
    # on, reason). Records [first, next) were never read.
    on_gap: Callable[[TP, int, int, str], None] = nothing


@dataclass(frozen=True)
class CommitEvents:
    """The offset committer's (``offset_commits.py``): on the commit thread, or the fetch
    thread in kafka_group mode."""

    # Instrumentation (metrics.py): a commit request's outcome and seconds.
    on_commit_request: Callable[[bool, float], None] = nothing
    # A lease whose commit Kafka refused for good (a newer holder fenced it): the lease
    # keeper drops it.
    on_fenced: Callable[[LeaseFenced], None] = nothing


@dataclass(frozen=True)
class LeaseCommitEvents:
    """The leases' commit path (``lease_commits.py``), on the event loop."""

    # The outcome of each commit round (None = success): the sidecar's fault hook.
    on_commit: Callable[[BaseException | None], None] = nothing
    # A lease verified after a stall delivers again: wakes a long-polling Fetch or Stream.
    on_verified: Callable[[], None] = nothing
    # A commit this sidecar did not make was found on a held partition: report it now.
    on_external: Callable[[], None] = nothing


@dataclass(frozen=True)
class RedeliveryEvents:
    """Redelivery's (``redelivery.py``), on the event loop."""

    # Records that came due, by why (visibility_timeout, nack, stream_end, not_sent).
    on_redelivery: Callable[[str, int], None] = nothing
    # Records given up past the delivery limit (the POISON_RECORD hook).
    on_given_up: Callable[[TP, int, GivenUp], None] = nothing
    # A given-up range parked for the dead-letter topic (dead_letter.py), with why it last
    # came due: the sidecar writes it there, then calls the keeper's dead_lettered().
    on_dead_letter: Callable[[TP, int, GivenUp, str], None] = nothing


@dataclass(frozen=True)
class LeaseEvents:
    """The lease keeper's (``leasing.py``), on the event loop; with those of the commit path
    and the redelivery it makes."""

    # Instrumentation (metrics.py): a lease change by kind (grant, revoke, expire); how
    # long a grant or revoke took to settle; a lease expiry's latency (its local deadline
    # until delivery was suspended).
    on_lease_change: Callable[[str], None] = nothing
    on_lease_settled: Callable[[str, float], None] = nothing
    on_partition_lost: Callable[[float], None] = nothing
    # A renewal may make buffered records deliverable again (they were held back within
    # the delivery margin): wakes a long-polling Fetch or Stream.
    on_renewed: Callable[[], None] = nothing
    commits: LeaseCommitEvents = field(default_factory=LeaseCommitEvents)
    redelivery: RedeliveryEvents = field(default_factory=RedeliveryEvents)


@dataclass(frozen=True)
class SessionEvents:
    """The assigner session's (``session.py``), on the event loop."""

    # Every SessionAccepted (a join, a re-join; its mode may switch kafka_group mode).
    on_accepted: Callable[[assigner_pb2.SessionAccepted], None] = nothing
    # The group's consumer config (version, properties) from a join or a ConfigUpdate.
    on_config: Callable[[int, dict[str, str]], None] = nothing
    # The group's live settings, from SessionAccepted and every ConfigUpdate: redelivery
    # (visibility timeout or None, max_deliveries, its dead-letter topic or ""),
    # external_offset_changes (follow | revert | ignore), ordering (unordered | key |
    # partition), commit fencing (lease | kafka | "" = the sidecar's).
    on_delivery_policy: Callable[[float | None, int, str], None] = nothing
    on_external_changes: Callable[[str], None] = nothing
    on_ordering: Callable[[str], None] = nothing
    on_commit_fencing: Callable[[str], None] = nothing
    # Instrumentation (metrics.py): a heartbeat sent; its ack's round trip. Leased mode's
    # joins (kafka_group mode's are Kafka's): a Join's result and its seconds (None for a
    # failed one), and joined until the session's first grant (the sync).
    on_heartbeat_sent: Callable[[], None] = nothing
    on_heartbeat_acked: Callable[[float], None] = nothing
    on_join: Callable[[bool, float | None], None] = nothing
    on_sync: Callable[[float], None] = nothing
