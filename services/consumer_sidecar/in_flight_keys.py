"""The keys of a partition's records in flight, for the ordering gate (issue 39; pure: no
I/O, no clock).

The gate asks on every take which keys are in flight in a partition. Rebuilding that set
from every un-acked record costs a take as much as the records in flight (a Stream's
credit: thousands); :class:`InFlightKeys` keeps a count per key from one take to the next
and reads only the runs of the ack tracker that changed since it last looked (records
handed out, acked, come due, given up): a run is (lo, hi) of consecutive offsets in flight,
and the same run in two looks holds the same records. When most of what was in flight went
(a small window, acked whole), it counts afresh instead.

The keys come from the caller's offset → key map; an offset the map does not know (handed
out before the group switched to an ordered mode) counts as :data:`ordering.UNKNOWN`. A
record's key must not change in the map while it is in flight (it is written when the
record is handed out, and pruned only below the commit point, after a look).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Set
from itertools import chain, repeat

from services.consumer_sidecar.ordering import UNKNOWN, HeldKey, Key

# Count afresh when what is in flight now is at most this many times what went since the
# last look: a record counted in C costs a few times less than one taken off in Python.
REBUILD_BELOW = 4


class InFlightKeys:
    def __init__(self) -> None:
        self._runs: set[tuple[int, int]] = set()  # the in-flight runs counted
        self._counts: Counter[HeldKey] = Counter()  # key → records in flight (None apart)
        self._keyless = 0  # records in flight without a key

    def sync(self, runs: Iterable[tuple[int, int]], keys: Mapping[int, Key]) -> None:
        """Count the records of ``runs`` (the in-flight runs now, as (lo, hi)) in place
        of those of the runs last seen."""
        current = set(runs)
        old = self._runs
        if current == old:
            return
        self._runs = current
        gone = old - current
        counts = self._counts
        if sum(hi - lo for lo, hi in current) <= REBUILD_BELOW * sum(hi - lo for lo, hi in gone):
            # most of what was counted went: counting afresh (in C) costs less
            counts.clear()
            self._keyless = 0
            self._add(current, keys)
            return
        for lo, hi in gone:  # a Python loop per record: only the records that went
            for key in _keys(lo, hi, keys):
                if key is None:
                    self._keyless -= 1
                elif (n := counts[key] - 1) > 0:
                    counts[key] = n
                else:
                    del counts[key]
        self._add(current - old, keys)

    def _add(self, runs: Iterable[tuple[int, int]], keys: Mapping[int, Key]) -> None:
        counts = self._counts
        counts.update(chain.from_iterable(_keys(lo, hi, keys) for lo, hi in runs))
        self._keyless += counts.pop(None, 0)

    @property
    def keys(self) -> Set[HeldKey]:
        """The keys with a record in flight (never None), a live view."""
        return self._counts.keys()

    @property
    def keyless(self) -> int:
        """How many records without a key are in flight."""
        return self._keyless


def _keys(lo: int, hi: int, keys: Mapping[int, Key]) -> Iterator[HeldKey]:
    return map(keys.get, range(lo, hi), repeat(UNKNOWN, hi - lo))
