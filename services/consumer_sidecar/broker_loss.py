"""A fetch consumer that knows no broker any more is made anew (pure: no I/O, no clock).

After every broker of the cluster went away and came back, librdkafka (2.10 and later)
can be left knowing no broker at all. A Metadata response that lists topics but no
brokers, which a broker starting up can send before any broker is registered, is
accepted, and every broker the client knew, the ``bootstrap.servers`` ones included, is
decommissioned as "not in the metadata" (``rd_kafka_metadata_decommission_unavailable_
brokers``). The same successful response stops the re-bootstrap timer, and with no broker
left no metadata request is ever sent again to start it, nor can "all brokers down" be
counted: the client connects nowhere, logs nothing and fetches nothing, for good. Its
statistics then list no broker but librdkafka's own entries (a consumer's logical
``GroupCoordinator``, node -1, state INIT; the internal ``:0/internal``).

CI met it on 4 Dec (a sidecar's fetch consumer, two partitions not delivered for the two
minutes the chaos test waited). Bare ``assign()`` consumers reproduce it: through 20 s
outages of all three brokers, 2 of 20 after the second outage, still stuck seven minutes
later; a new ``incremental_assign()`` of their partitions does not revive them, a new
consumer does (2 of 40 stuck after the fifth outage of another run, both fetching again
within 20 s of their replacement; docs/operate/failure-model.md, "Every broker down, then
back").

So the fetch loop's statistics are watched: a fetch consumer whose statistics have listed
no broker it could connect to for :data:`REPLACE_AFTER_SECONDS` is replaced in place
(``Fetcher.replace_consumer``: the same partitions at the buffer's positions, nothing
delivered twice or skipped, no lease changes). A client in an ordinary outage lists its
brokers (down) and is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

# Long enough that a statistics document caught between a decommission and a new
# broker's registration does not count; short against a lease's life.
REPLACE_AFTER_SECONDS = 10.0


@dataclass
class BrokerLoss:
    """Since when the fetch consumer's statistics list no broker, and whether it is due
    to be replaced. Fed on the fetch thread (its statistics callback)."""

    after: float = REPLACE_AFTER_SECONDS
    since: float | None = None
    asked: bool = False  # a replacement was asked for and has not happened yet

    def seen(self, knows_a_broker: bool, at: float) -> bool:
        """Statistics of ``at``: True exactly once when the consumer has known no broker
        for ``after`` seconds (then ask for a replacement)."""
        if knows_a_broker:
            self.since = None
            return False
        if self.since is None:
            self.since = at
        if self.asked or at - self.since < self.after:
            return False
        self.asked = True
        return True

    def replaced(self) -> None:
        """A new consumer took over: count afresh (a new one that knows no broker either
        is replaced again after ``after`` seconds)."""
        self.since = None
        self.asked = False
