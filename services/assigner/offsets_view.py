"""Offsets as the event loop reads them: a :class:`KafkaOffsets`-like reader in worker
threads, single-flight and briefly cached, every wait bounded by the caller's budget.

Documented behaviour (DescribeGroup, ListGroups and ``/ui`` share one view):

* DescribeGroup's committed and end offsets are at most 1 s old: concurrent and repeated
  calls share one Kafka read per group per second, so polling it costs Kafka nothing more.
* ``lag_seconds`` needs the timestamp of the record at the committed offset; it is read
  once per (partition, offset) and remembered, since it never changes. DescribeGroup waits
  for a probe only briefly (and one probe runs at a time, at most every 2 s); a partition
  whose record was not read yet, or carries no timestamp, reports -1 (unknown).
* ListGroups computes ``total_lag`` live for the groups of the page (one committed-offsets
  request per group, one end-offsets request per partition, within one deadline); when
  Kafka cannot answer in time it reports -1 (unknown) instead of failing the listing.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dsclient.reasons import DsError
from services.assigner.offsets import Offsets, unavailable
from services.runtime.topic_partition import TopicPartition

# DescribeGroup may be polled many times a second (tests watch handoffs that way): offsets
# are read at most once per OFFSETS_MAX_AGE per group, and a new lag_seconds probe starts at
# most once per LAG_PROBE_INTERVAL.
OFFSETS_MAX_AGE_SECONDS = 1.0
LAG_PROBE_INTERVAL_SECONDS = 2.0
RECORD_TIMESTAMPS_KEPT = 100_000


class OffsetsReader(Protocol):
    """The blocking reads :class:`OffsetsView` runs in worker threads
    (:class:`~services.assigner.kafka_offsets.KafkaOffsets` in the assigner)."""

    def read(self, group: str, partitions: Sequence[TopicPartition]) -> Offsets: ...

    def read_many(
        self, groups: Mapping[str, Sequence[TopicPartition]]
    ) -> dict[str, Offsets | DsError]: ...

    def oldest_timestamps(
        self, starts: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...


class OffsetsView:
    """What the event loop uses: the reader in worker threads, single-flight and briefly
    cached, every wait bounded by the caller's budget. Owns the reader (:meth:`close`)."""

    def __init__(
        self,
        reader: OffsetsReader,
        *,
        max_age: float = OFFSETS_MAX_AGE_SECONDS,
        probe_interval: float = LAG_PROBE_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.max_age = max_age
        self.probe_interval = probe_interval
        self.clock = clock
        self._cached: dict[str, tuple[tuple[TopicPartition, ...], float, Offsets]] = {}
        self._reads: dict[str, asyncio.Task[Offsets]] = {}
        self._forgotten_at: dict[str, float] = {}
        self._known: OrderedDict[tuple[TopicPartition, int], int] = OrderedDict()
        self._probe: asyncio.Task[None] | None = None
        self._next_probe = 0.0

    def close(self) -> None:
        """Close the reader's Kafka clients (blocking: call it in a worker thread)."""
        self.reader.close()

    async def group(self, group: str, partitions: Sequence[TopicPartition], wait: float) -> Offsets:
        """The group's offsets, read at most ``max_age`` ago; KAFKA_UNAVAILABLE when Kafka
        does not answer within ``wait`` (or the read's own timeout)."""
        key = tuple(partitions)
        cached = self._cached.get(group)
        if cached is not None and cached[0] == key and self.clock() - cached[1] <= self.max_age:
            return cached[2]
        task = self._reads.get(group)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(group, key))
            task.add_done_callback(_retrieve)
            self._reads[group] = task
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait, 0.0))
        except TimeoutError as exc:
            raise unavailable(
                f"Kafka did not answer for the offsets of group {group!r} in time", group
            ) from exc

    def forget(self, group: str) -> None:
        """Drop the group's cached offsets: they just changed (an offset reset), and the next
        DescribeGroup must show the new ones, not those read up to a second ago."""
        self._cached.pop(group, None)
        self._reads.pop(group, None)  # a read in flight began before: the next one starts anew
        self._forgotten_at[group] = self.clock()

    async def _read(self, group: str, partitions: tuple[TopicPartition, ...]) -> Offsets:
        try:
            started = self.clock()
            value = await asyncio.to_thread(self.reader.read, group, partitions)
            if self._forgotten_at.get(group, float("-inf")) < started:
                self._cached[group] = (partitions, started, value)
            return value
        finally:
            if self._reads.get(group) is asyncio.current_task():
                self._reads.pop(group, None)

    async def many(
        self, groups: Mapping[str, Sequence[TopicPartition]], wait: float
    ) -> dict[str, Offsets | DsError]:
        """Offsets of several groups in one batch; a group not read within ``wait`` maps to
        a DsError (ListGroups reports its lag as unknown)."""
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.reader.read_many, groups)
        )
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(task), max(wait, 0.0))
        except TimeoutError:
            err = unavailable("Kafka did not answer for the groups' offsets in time")
            return {g: err for g in groups}

    async def oldest_timestamps(
        self, starts: Mapping[TopicPartition, int], wait: float
    ) -> dict[TopicPartition, int]:
        """Timestamps (ms) of the records at ``starts``: the remembered ones, plus what a
        probe (started now if none ran within ``probe_interval``) reads within ``wait``."""
        missing = {tp: o for tp, o in starts.items() if (tp, o) not in self._known}
        if missing and self._probe is None and self.clock() >= self._next_probe:
            self._next_probe = self.clock() + self.probe_interval
            self._probe = asyncio.get_running_loop().create_task(self._run_probe(missing))
        if missing and self._probe is not None and wait > 0:
            await asyncio.wait({self._probe}, timeout=wait)
        return {tp: self._known[(tp, o)] for tp, o in starts.items() if (tp, o) in self._known}

    async def _run_probe(self, starts: Mapping[TopicPartition, int]) -> None:
        try:
            found = await asyncio.to_thread(self.reader.oldest_timestamps, starts)
            for tp, ts in found.items():
                self._known[(tp, starts[tp])] = ts
            while len(self._known) > RECORD_TIMESTAMPS_KEPT:
                self._known.popitem(last=False)
        except Exception:
            pass  # unknown stays -1; the next probe tries again
        finally:
            self._probe = None


def budget(time_remaining: float | None, cap: float, share: float = 0.5) -> float:
    """How long a step may wait: ``share`` of the call's remaining deadline, at most ``cap``."""
    if time_remaining is None:
        return cap
    return max(0.0, min(cap, time_remaining * share))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared task's outcome as seen even when every waiter gave up on it."""
    if not task.cancelled():
        task.exception()
